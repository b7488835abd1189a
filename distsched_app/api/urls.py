"""REST API routes (filled in by the API module)."""

urlpatterns: list = []

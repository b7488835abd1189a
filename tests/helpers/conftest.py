# The fixtures of distsched_app.pytest_plugin, imported as a user's conftest may (a non-root conftest
# cannot list pytest_plugins).
from distsched_app.pytest_plugin import distsched_clock, distsched_drain  # noqa: F401

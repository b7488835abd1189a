"""Who may use the API and /metrics: staff read; staff with the change permission mutate."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission


class IsStaffReadChangeWrite(BasePermission):
    """Authenticated staff may read. Writes need ``distsched_app.change_<model>``,
    where the view names the model in ``permission_model`` (e.g. "schedule")."""

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated and user.is_staff):
            return False
        if request.method in SAFE_METHODS:
            return True
        if request.method not in getattr(view, "allowed_methods", (request.method,)):
            # The view has no handler for it: nothing to protect, let DRF answer 405.
            return True
        model = getattr(view, "permission_model", None)
        return bool(model) and user.has_perm(f"distsched_app.change_{model}")

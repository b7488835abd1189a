"""Who may use the API and /metrics: Django's model permissions, as the admin reads them.

Each view names, per action, the permissions any one of which lets a user in
(``required_permissions``). The vocabulary is Django's: ``view_<model>`` reads,
``add_schedule`` creates a schedule and ``add_run`` enqueues a run, ``change_<model>``
updates and acts (pause, resume, trigger; cancel, requeue), ``delete_schedule`` deletes, and the custom
``view_metrics`` reads ``/metrics``. As in the admin, ``change_<model>`` also
lets a user read that model (a user who may edit a schedule may look at it).

``is_staff`` is not consulted: it says who may log in to the admin site (and so
get a session), while the permissions say what a user may do. A service account
such as Prometheus' then holds one permission and a token, and cannot log in
anywhere. A user without permissions gets 403 everywhere, staff or not.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

APP_LABEL = "distsched_app"

# What an action without an entry of its own needs: HEAD is a GET, OPTIONS
# describes the endpoint, so both need what reading it needs.
ALIASES = {"head": "get", "options": "get", "metadata": "list"}


def may_read(model: str) -> tuple[str, ...]:
    """Reading a model: its view permission, or its change permission (the admin's rule)."""
    return (f"{APP_LABEL}.view_{model}", f"{APP_LABEL}.change_{model}")


def may(verb: str, model: str) -> tuple[str, ...]:
    """``may("add", "schedule")``: exactly that permission."""
    return (f"{APP_LABEL}.{verb}_{model}",)


METRICS = (f"{APP_LABEL}.view_metrics",)


def _action(request: Any, view: Any) -> str | None:
    """The view's name for what the request asks: a viewset's action, else the HTTP method."""
    if hasattr(view, "action_map"):  # a viewset: None when the method is not routed
        return view.action
    method = request.method.lower()
    return method if method in getattr(view, "http_method_names", ()) and hasattr(view, method) else None


class ModelPermissions(BasePermission):
    """Django model permissions per action, like DRF's ``DjangoModelPermissions`` (which maps
    only HTTP methods, and so cannot tell creating a schedule from pausing one).

    The view maps each action to the permissions of which the user needs one;
    ``required_permissions = None`` means any permission of this app (as the
    admin shows an app to a user with any of its permissions). An action the
    view does not map is refused, so a new action is closed until someone names
    its permission.
    """

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False  # DRF answers 401 with the first authenticator's challenge
        required = getattr(view, "required_permissions", {})
        if required is None:
            return user.has_module_perms(APP_LABEL)
        action = _action(request, view)
        if action is None:
            return True  # no handler for this method: nothing to protect, DRF answers 405
        action = action if action in required else ALIASES.get(action, action)
        return any(user.has_perm(perm) for perm in required.get(action, ()))

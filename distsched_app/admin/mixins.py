"""What the distsched ModelAdmins inherit: the admin stylesheet, read-only histories,
changelists that refuse unstorable query text, and POST-only buttons on change pages.

A button is a URL under the object's change page (``<id>/pause/``): POST only, it asks
``check_object_action`` (the permission), calls ``<name>_object`` (one service call
through ``support.apply_each``) and redirects back to the page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib.admin import ModelAdmin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import unquote
from django.http import Http404, HttpRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path

from ..text import unstorable
from .display import change_url


class DistschedMedia:
    """The admin pages of distsched carry its small stylesheet (badges, buttons)."""

    class Media:
        css = {"all": ("distsched_app/admin.css",)}


# The mixin is only ever mixed into a ModelAdmin: type-check it as one.
_ModelAdminBase: Any = ModelAdmin if TYPE_CHECKING else object


class ReadOnlyAdminMixin(_ModelAdminBase):
    """An append-only history: shown, never added, changed or deleted through the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StorableLookupsMixin(_ModelAdminBase):
    """A changelist whose search or filter parameters hold text no database column can hold
    (NUL: PostgreSQL refuses it as a query parameter) gets Django's "invalid lookup" page,
    as any other bad filter does, instead of a database error."""

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        for key, values in request.GET.lists():
            if any(unstorable(text) for text in (key, *values)):
                raise IncorrectLookupParameters(f"unstorable text in the {key!r} parameter")
        return super().get_changelist_instance(request)


class ObjectActionsMixin(_ModelAdminBase):
    """POST-only buttons on a change page, each calling one service through ``apply_each``."""

    object_actions: tuple[str, ...] = ()

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        urls = [
            path(
                f"<path:object_id>/{name}/",
                self.admin_site.admin_view(self._object_action_view(name)),
                name=f"{info[0]}_{info[1]}_{name}",
            )
            for name in self.object_actions
        ]
        return urls + super().get_urls()

    def _object_action_view(self, name: str):
        def view(request: HttpRequest, object_id: str):
            if request.method != "POST":
                return HttpResponseNotAllowed(["POST"])
            obj = self.get_object(request, unquote(object_id))
            if obj is None:
                raise Http404(f"no {self.opts.verbose_name} with id {object_id!r}")
            self.check_object_action(request, obj, name)
            getattr(self, f"{name}_object")(request, obj)
            return HttpResponseRedirect(change_url(self.model, obj.pk))

        view.__name__ = f"{name}_view"
        return view

    def check_object_action(self, request: HttpRequest, obj: Any, name: str) -> None:
        raise NotImplementedError

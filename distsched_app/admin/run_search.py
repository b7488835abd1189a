"""The run list's kwargs search (``?kwargs__account_id=42``, bounded by ``since``/``until`` or the
last ``DEFAULT_WINDOW``): a sidebar filter that takes those parameters off Django's own lookups and
applies ``services.run_search``.

Django checks every query-string key with ``lookup_allowed`` before list filters run, so
``RunAdmin.lookup_allowed`` lets these through (``is_search_param``); this filter then pops them,
validates them with the service (an invalid key or value raises ``IncorrectLookupParameters``:
Django's invalid-lookup page, with the reason as a message), and shows what is applied.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters

from ..errors import ValidationError
from ..services import run_search
from .display import ts
from .support import request_now

COUNT_CAP = 1000
"""A kwargs search's list counts at most this many runs (and one more): no index narrows it."""


def paginator_for(request, paginator):
    """The run list's paginator, its count capped while a kwargs search is applied."""
    if getattr(request, "_distsched_kwargs_search", False):
        paginator.count_cap = COUNT_CAP
    return paginator


class KwargsSearchFilter(admin.ListFilter):
    title = "kwargs"
    template = "admin/distsched_app/run/kwargs_filter.html"

    def __init__(self, request, params, model, model_admin):
        super().__init__(request, params, model, model_admin)
        mine = {name: str(params.pop(name)[-1]) for name in list(params) if run_search.is_search_param(name)}
        self.used_parameters.update(mine)
        try:
            self.search = run_search.parse(mine, now=request_now(request))
        except ValidationError as exc:
            messages.error(request, f"Run search: {exc}")
            raise IncorrectLookupParameters(str(exc)) from None

    def has_output(self) -> bool:
        return True  # else Django never calls queryset()

    def expected_parameters(self) -> list[str | None]:
        return list(self.used_parameters)

    def queryset(self, request, queryset):
        if self.search.terms:
            request._distsched_kwargs_search = True  # read by paginator_for
        return self.search.apply(queryset)

    def choices(self, changelist) -> Iterator[Any]:
        search = self.search
        terms = [{"path": path, "value": value} for path, value in search.terms.items()]
        yield from [
            {
                "terms": terms,
                "since": ts(search.since) if search.since else None,
                "until": ts(search.until) if search.until else None,
                "defaulted": search.defaulted,
                "window": run_search.DEFAULT_WINDOW_TEXT,
                "count_cap": f"{COUNT_CAP:,}",
                "clear": changelist.get_query_string(remove=self.expected_parameters()),
            }
        ]

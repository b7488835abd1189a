"""Search runs by a kwarg (``services.run_search``): JSON comparison, the default time bound, and
hostile keys and values refused with a typed error."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.errors import ValidationError
from distsched_app.models import Run
from distsched_app.services import run_search
from distsched_app.services.enqueue import Job, enqueue
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def add(at=T0, **kwargs) -> Run:
    return enqueue(Job(task_name="tests.echo", kwargs=kwargs), now=at).run


def found(params: dict, *, now=T0) -> list[int]:
    search = run_search.parse(params, now=now)
    return sorted(search.apply(Run.objects.all()).values_list("pk", flat=True))


def test_values_are_compared_as_json():
    number, text, other = add(account_id=42), add(account_id="42"), add(account_id=7)
    flag, region = add(active=True), add(region="eu")
    assert found({"kwargs__account_id": "42"}) == [number.pk]
    assert found({"kwargs__account_id": '"42"'}) == [text.pk]
    assert found({"kwargs__account_id": "7"}) == [other.pk]
    assert found({"kwargs__active": "true"}) == [flag.pk]
    assert found({"kwargs__region": "eu"}) == [region.pk]  # not JSON: text
    assert found({"kwargs__account_id": "43"}) == []
    add(account_id=[42])  # a list holding the value is not the value (containment on PostgreSQL)
    assert found({"kwargs__account_id": "42"}) == [number.pk]


def test_nested_keys_and_several_terms():
    both = add(customer={"id": 5, "tier": "gold"}, region="eu")
    add(customer={"id": 5, "tier": "free"}, region="eu")
    assert found({"kwargs__customer__id": "5", "kwargs__customer__tier": "gold"}) == [both.pk]


def test_the_default_window_and_explicit_bounds():
    old = add(at=T0 - timedelta(hours=25), account_id=1)
    recent = add(at=T0 - timedelta(hours=23), account_id=1)
    search = run_search.parse({"kwargs__account_id": "1"}, now=T0)
    assert search.defaulted and search.since == T0 - run_search.DEFAULT_WINDOW
    assert found({"kwargs__account_id": "1"}) == [recent.pk]
    since = (T0 - timedelta(days=30)).isoformat()
    assert found({"kwargs__account_id": "1", "since": since}) == [old.pk, recent.pk]
    until = (T0 - timedelta(hours=24)).isoformat()
    assert found({"kwargs__account_id": "1", "since": since, "until": until}) == [old.pk]
    assert not run_search.parse({}, now=T0).defaulted  # no search: no bound
    assert found({"kwargs__account_id": "1", "since": until, "until": since}) == []  # an empty span: nothing


def test_the_default_search_reads_at_most_the_newest_runs_of_its_window(monkeypatch):
    """A busy day holds millions of runs: without bounds the search reads at most the newest
    DEFAULT_MAX_RUNS (by id); explicit bounds read the whole span they ask for."""
    monkeypatch.setattr(run_search, "DEFAULT_MAX_RUNS", 3)
    matching = [add(at=T0 - timedelta(minutes=10 - i), account_id=1) for i in range(3)]
    add(at=T0 - timedelta(minutes=5), account_id=2)
    add(at=T0 - timedelta(minutes=4), account_id=2)
    assert found({"kwargs__account_id": "1"}) == [matching[2].pk]  # the newest three ids: one matches
    since = (T0 - timedelta(hours=1)).isoformat()
    assert found({"kwargs__account_id": "1", "since": since}) == [r.pk for r in matching]


@pytest.mark.parametrize(
    "params",
    [
        {"kwargs__": "1"},
        {"kwargs__account-id": "1"},
        {"kwargs__0": "1"},  # a list index to a JSON path
        {"kwargs__a__contains": "1"},  # a lookup name, not a key
        {"kwargs__a__b__c__d__e": "1"},
        {"kwargs__a'); DROP TABLE x; --": "1"},
        {"kwargs__a": "[1, 2]"},
        {"kwargs__a": '{"b": 1}'},
        {"kwargs__a": "null"},
        {"kwargs__a": "1e999"},
        {"kwargs__a": str(2**64)},
        {"kwargs__a": "x" * 501},
        {"kwargs__a": "nul\x00"},
        {"kwargs__a": '"\\u0000"'},
        {"kwargs__a": "1", "since": "yesterday"},
        {"kwargs__a": "1", "since": "2026-03-01T00:00:00"},  # no offset
        {"kwargs__a": "1", "since": "0001-01-01T00:00:00+05:00"},  # no UTC date
        {"since": "9999-12-31T23:59:59-05:00"},
        {"until": "2026-13-01T00:00:00Z"},
    ],
)
def test_hostile_keys_and_values_are_refused(params):
    with pytest.raises(ValidationError):
        run_search.parse(params, now=T0)

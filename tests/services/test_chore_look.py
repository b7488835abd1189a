"""An idle worker's chore look: one statement says whether a leader lives and whether a bulk action waits,
and the loop's sweep and bulk chores ask it once between them."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from distsched_app.models import Leader
from distsched_app.services import bulk, chore_look
from distsched_app.services import limits as limit_service
from distsched_app.services.leader import DatabaseStore
from distsched_app.worker import loop as loop_module
from tests.bulk_factories import make_runs
from tests.conftest import T0

pytestmark = pytest.mark.django_db(transaction=True)


def elect(lease: float = 30.0) -> None:
    assert DatabaseStore().acquire(holder="ticker", pid=1, host="h", lease_seconds=lease) is not None


def test_nothing_to_do_and_no_leader_ever_elected(clock):
    with CaptureQueriesContext(connection) as queries:
        found = chore_look.look(clock.now())
    assert found == chore_look.ChoreLook(leader_live=False, bulk_waiting=False)
    assert len(queries) == 1


def test_a_live_leader_is_seen_and_an_expired_one_is_not(clock):
    elect()
    assert chore_look.look(clock.now()).leader_live is True
    Leader.objects.update(expires_at=T0 - timedelta(days=1))  # the database's clock is past it
    assert chore_look.look(clock.now()).leader_live is False


def test_a_bulk_action_waits_until_leased_and_again_once_its_lease_runs_out(clock):
    make_runs(2, now=clock.now())
    job = bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=clock.now())
    assert chore_look.look(clock.now()).bulk_waiting is True
    assert bulk.acquire("other", clock.now()) is not None  # leased: nobody else should take it now
    assert chore_look.look(clock.now()).bulk_waiting is False
    later = clock.now() + timedelta(seconds=bulk.LEASE_SECONDS + 1)
    assert chore_look.look(later).bulk_waiting is True  # its holder went quiet
    bulk.stop_bulk_action(job.pk, now=clock.now())
    assert chore_look.look(later).bulk_waiting is False  # finished jobs never wait


def sweeps(monkeypatch) -> list[object]:
    calls: list[object] = []
    monkeypatch.setattr(limit_service, "sweep", lambda now: calls.append(now))
    return calls


def test_an_idle_worker_under_a_live_leader_pays_one_statement_for_both_chores(scheduler, monkeypatch):
    elect()
    swept = sweeps(monkeypatch)
    worker = scheduler.worker(worker_id="idle", heartbeat_seconds=3600)
    with CaptureQueriesContext(connection) as queries:
        worker.loop.maybe_sweep()
        worker.loop.maybe_bulk()
    assert len(queries) == 1 and swept == []  # the leader sweeps; no bulk action waits


def test_with_no_live_leader_the_worker_sweeps_itself(scheduler, monkeypatch):
    swept = sweeps(monkeypatch)
    worker = scheduler.worker(worker_id="idle", heartbeat_seconds=3600)
    worker.loop.maybe_sweep()
    assert len(swept) == 1
    elect()
    worker.loop._next_sweep = 0.0
    worker.loop._look_at = float("-inf")  # the last look is stale: ask again
    worker.loop.maybe_sweep()
    assert len(swept) == 1


def test_a_look_serves_both_chores_only_while_recent(scheduler, monkeypatch):
    worker = scheduler.worker(worker_id="idle", heartbeat_seconds=3600)
    looks: list[object] = []
    real = chore_look.look
    monkeypatch.setattr(chore_look, "look", lambda now: looks.append(now) or real(now))
    worker.loop.chores()
    worker.loop.chores()
    assert len(looks) == 1
    worker.loop._look_at = time.monotonic() - loop_module.LOOK_REUSE_SECONDS - 0.01
    worker.loop.chores()
    assert len(looks) == 2


def test_a_failed_look_is_logged_and_both_chores_do_what_they_did_before(scheduler, monkeypatch, caplog):
    elect()  # a leader lives, but the look cannot say so
    swept = sweeps(monkeypatch)
    processed: list[str] = []
    monkeypatch.setattr(chore_look, "look", lambda now: (_ for _ in ()).throw(RuntimeError("no such table")))
    monkeypatch.setattr(
        bulk, "process_bulk_actions", lambda clock, **kw: processed.append(kw["owner"]) or bulk.Processed(batches=0)
    )
    worker = scheduler.worker(worker_id="idle", heartbeat_seconds=3600)
    worker.loop.maybe_sweep()  # not raised: claims go on
    worker.loop.maybe_bulk()
    assert len(swept) == 1 and processed == ["idle"]
    assert any(r.getMessage().startswith("error looking for chores") for r in caplog.records)


def test_an_unfinished_bulk_action_goes_on_at_the_next_turn_without_a_look(scheduler, monkeypatch):
    worker = scheduler.worker(worker_id="busy-bulk", heartbeat_seconds=3600)
    results = [bulk.Processed(batches=1, more=True), bulk.Processed(batches=1)]
    monkeypatch.setattr(bulk, "process_bulk_actions", lambda clock, **kw: results.pop(0))
    make_runs(2, now=worker.clock.now())
    bulk.create_bulk_action(action="requeue", filter={"state": "dead"}, now=worker.clock.now())
    worker.loop.maybe_bulk()
    assert worker.loop._next_bulk == 0.0
    looks: list[object] = []
    monkeypatch.setattr(chore_look, "look", lambda now: looks.append(now))  # would say nothing waits
    worker.loop.maybe_bulk()
    assert results == [] and looks == []

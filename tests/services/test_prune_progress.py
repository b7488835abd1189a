"""Pruning with a progress callback: counted first, told after each committed batch, and
stopped by Ctrl-C between batches (or inside one, rolled back) with what was done."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.signals import pre_delete

from distsched_app.models import EventType, Origin, Run, RunEvent, RunState, Worker
from distsched_app.services import events, workers
from distsched_app.services.maintenance import PruneInterrupted, PruneProgress, prune_runs
from tests.conftest import T0

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def make_runs(schedule, n, *, finished_at, n_events=2) -> list[Run]:
    runs = []
    for i in range(n):
        run = Run.objects.create(
            schedule=schedule,
            task_name=schedule.task_name,
            state=RunState.SUCCEEDED,
            scheduled_for=T0 - 60 * DAY,
            available_at=T0 - 60 * DAY,
            finished_at=finished_at,
            origin=Origin.MANUAL,
            idempotency_key=f"k{i}-{finished_at.isoformat()}",
            created_at=T0 - 60 * DAY,
            updated_at=T0 - 60 * DAY,
        )
        events.record_many(
            [events.NewEvent(run_id=run.pk, event_type=EventType.CREATED, now=T0 - 60 * DAY) for _ in range(n_events)]
        )
        runs.append(run)
    return runs


@pytest.fixture
def five_old_one_young(make_schedule):
    schedule = make_schedule("s1")
    old = make_runs(schedule, 5, finished_at=T0 - 40 * DAY)
    young = make_runs(schedule, 1, finished_at=T0 - DAY)
    workers.register_worker(worker_id="gone", hostname="h", pid=1, queues=["default"], now=T0 - 40 * DAY)
    return old, young


def assert_consistent(young_ids) -> None:
    """Every run left has its whole history; no event outlived its run."""
    assert not RunEvent.objects.exclude(run_id__in=Run.objects.values("pk")).exists()
    for run in Run.objects.all():
        assert RunEvent.objects.filter(run=run).count() == 2
    assert set(young_ids) <= set(Run.objects.values_list("pk", flat=True))


def test_progress_is_counted_first_then_told_after_each_committed_batch(five_old_one_young):
    seen: list[PruneProgress] = []
    result = prune_runs(older_than=30 * DAY, now=T0, batch_size=2, progress=seen.append)
    assert [(p.runs, p.events, p.batches, p.total) for p in seen] == [
        (0, 0, 0, 5),  # before the first batch: the count is the ETA's denominator
        (2, 4, 1, 5),
        (4, 8, 2, 5),
        (5, 10, 3, 5),
    ]
    assert {p.cutoff for p in seen} == {T0 - 30 * DAY}
    assert (result.runs, result.events, result.batches, result.workers) == (5, 10, 3, 1)


def test_no_progress_callback_on_a_dry_run(five_old_one_young):
    seen: list[PruneProgress] = []
    result = prune_runs(older_than=30 * DAY, now=T0, batch_size=2, dry_run=True, progress=seen.append)
    assert seen == [] and result.runs == 5 and Run.objects.count() == 6


def test_ctrl_c_from_the_callback_stops_between_batches_and_says_what_was_done(five_old_one_young):
    _old, young = five_old_one_young

    def interrupt_after_two_batches(p: PruneProgress) -> None:
        if p.batches == 2:
            raise KeyboardInterrupt

    with pytest.raises(PruneInterrupted) as info:
        prune_runs(older_than=30 * DAY, now=T0, batch_size=2, progress=interrupt_after_two_batches)
    done = info.value.done
    assert isinstance(info.value, KeyboardInterrupt)  # code that knows nothing of it still stops
    assert (done.runs, done.events, done.batches, done.workers, done.dry_run) == (4, 8, 2, 0, False)
    assert Run.objects.count() == 2  # one old run left for the next prune, and the young one
    assert_consistent([r.pk for r in young])
    assert Worker.objects.filter(worker_id="gone").exists()  # workers go last: not reached

    again = prune_runs(older_than=30 * DAY, now=T0, batch_size=2)  # running it again goes on
    assert (again.runs, again.workers) == (1, 1)
    assert_consistent([r.pk for r in young])


def test_ctrl_c_inside_a_batch_rolls_that_batch_back_whole(five_old_one_young):
    _old, young = five_old_one_young
    deleting: list[int] = []

    def interrupt_second_batch(sender, instance, **kwargs):
        deleting.append(instance.pk)
        if len(deleting) == 3:  # the first run of the second batch, after its events were deleted
            raise KeyboardInterrupt

    pre_delete.connect(interrupt_second_batch, sender=Run)
    try:
        with pytest.raises(PruneInterrupted) as info:
            prune_runs(older_than=30 * DAY, now=T0, batch_size=2, progress=lambda p: None)
    finally:
        pre_delete.disconnect(interrupt_second_batch, sender=Run)
    assert (info.value.done.runs, info.value.done.events, info.value.done.batches) == (2, 4, 1)
    assert Run.objects.count() == 4  # the second batch's runs are back, with their events
    assert_consistent([r.pk for r in young])


def test_ctrl_c_during_the_count_deletes_nothing(five_old_one_young, monkeypatch):
    from distsched_app.services import maintenance

    class Interrupting:
        def count(self):
            raise KeyboardInterrupt

    real = maintenance.prunable_runs
    calls = []

    def prunable(cutoff):
        calls.append(cutoff)
        return Interrupting() if len(calls) == 1 else real(cutoff)

    monkeypatch.setattr(maintenance, "prunable_runs", prunable)
    with pytest.raises(PruneInterrupted) as info:
        prune_runs(older_than=30 * DAY, now=T0, progress=lambda p: None)
    assert (info.value.done.runs, info.value.done.batches) == (0, 0)
    assert Run.objects.count() == 6

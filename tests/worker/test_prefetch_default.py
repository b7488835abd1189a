"""The worker's batch size when neither ``--prefetch`` nor ``PREFETCH`` says: 128 on every
database (each transaction pays a durable commit, and on SQLite whole pages, whatever its size;
issue 17). A setting or an option always wins."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from distsched_app.conf import DEFAULTS, conf
from distsched_app.management.commands import runworker
from distsched_app.models import EventType, Run, RunEvent, RunState
from distsched_app.services import claiming
from distsched_app.services.enqueue import Job, enqueue_many
from distsched_app.worker import Worker

pytestmark = pytest.mark.django_db


@pytest.fixture
def unset(settings):
    settings.DISTSCHED = {k: v for k, v in settings.DISTSCHED.items() if k != "PREFETCH"}


def test_unset_a_worker_batches_128_runs_on_every_database(unset):
    assert DEFAULTS["PREFETCH"] == conf.PREFETCH == 128
    assert Worker(worker_id="w").prefetch == 128


def test_unset_runworker_builds_its_workers_with_128(unset):
    """``runworker`` (and each child of ``--processes``, built the same way) passes no
    ``--prefetch`` of its own: the default is the setting's."""
    command = runworker.Command()
    options = command.create_parser("manage.py", "runworker").parse_args([])
    assert options.prefetch is None
    assert command.make_worker(vars(options), "w").prefetch == 128


def test_unset_one_claim_takes_128_quick_runs(unset, clock, monkeypatch):
    now = clock.now()
    enqueue_many([Job(task_name="tests.noop") for _ in range(130)], now=now)
    claims: list[tuple[int, int]] = []  # (limit asked, runs taken) of each claim
    claim_runs = claiming.claim_runs

    def spy(**kwargs):
        runs = claim_runs(**kwargs)
        claims.append((kwargs["limit"], len(runs)))
        return runs

    monkeypatch.setattr(claiming, "claim_runs", spy)
    worker = Worker(worker_id="w", clock=clock, heartbeat_seconds=3600)
    worker.pace.observe(0.0)  # tasks known to be quick: full batches from the first claim
    assert worker.run(burst=True, install_signals=False) == 130
    assert claims[:2] == [(128, 128), (128, 2)]
    assert RunEvent.objects.filter(event_type=EventType.CLAIMED).count() == 130
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 130


def test_the_setting_and_the_option_win_on_every_database(settings):
    settings.DISTSCHED = {**settings.DISTSCHED, "PREFETCH": 32}
    assert Worker(worker_id="w").prefetch == 32
    assert Worker(worker_id="w", prefetch=8).prefetch == 8
    call_command("check")  # an explicit value within range passes the system checks

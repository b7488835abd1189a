"""Processes enqueueing at once, each call its own transaction (autocommit), as web requests do.

On SQLite an enqueue without a unique key is one statement into the enqueue view (migration
0028), which computes the run's id itself: every run must get its own id, its own
``enqueued:<id>`` key and exactly one ``created`` event, with nobody seeing "database is locked".
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from distsched_app.models import EventType, Run, RunEvent
from tests.concurrency.procs import ROOT, child_env, finish

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PROCESSES, EACH = 3, 150

ENQUEUER = textwrap.dedent(f"""
    import sys
    import django
    django.setup()
    from distsched_app.clock import system_clock
    from distsched_app.services.enqueue import Job, enqueue

    ids = [
        enqueue(Job(task_name="tests.noop", args=[sys.argv[1], i]), now=system_clock.now()).pk for i in range({EACH})
    ]
    print(" ".join(map(str, ids)), flush=True)
""")


def test_processes_enqueueing_at_once_get_distinct_runs_each_with_one_created_event():
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [
        subprocess.Popen([sys.executable, "-c", ENQUEUER, f"p{i}"], cwd=ROOT, env=child_env(), **pipes)
        for i in range(PROCESSES)
    ]
    results = finish(procs, timeout=120)
    assert [code for code, _, _ in results] == [0] * PROCESSES, [err for _, _, err in results]
    returned = [int(pk) for _, out, _ in results for pk in out.split()]
    assert len(returned) == len(set(returned)) == PROCESSES * EACH
    runs = {r.pk: r for r in Run.objects.all()}
    assert set(runs) == set(returned)
    assert all(r.idempotency_key == f"enqueued:{pk}" for pk, r in runs.items())
    assert Counter((r.args[0], r.args[1]) for r in runs.values()) == Counter(
        (f"p{p}", i) for p in range(PROCESSES) for i in range(EACH)
    )
    events = Counter(RunEvent.objects.filter(event_type=EventType.CREATED).values_list("run_id", flat=True))
    assert events == Counter(returned) and RunEvent.objects.count() == len(returned)

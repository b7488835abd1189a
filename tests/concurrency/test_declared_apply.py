"""Several processes applying the same declared schedules at once (tickers starting together):
each schedule is created once and changed once, whoever wins; nobody fails."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from distsched_app.models import AuditEntry, Schedule
from tests.concurrency.procs import finish, manage

pytestmark = pytest.mark.django_db(transaction=True)

N = 30


def apply_all(path, processes: int = 3) -> list[dict]:
    procs = [manage("distsched", "schedule", "apply", "--file", str(path), "--json") for _ in range(processes)]
    results = finish(procs, timeout=180)
    for code, _, stderr in results:
        assert code == 0, stderr[-2000:]
    return [json.loads(stdout) for _, stdout, _ in results]


def actions(reports: list[dict]) -> Counter:
    return Counter(s["action"] for r in reports for s in r["schedules"])


def test_three_processes_apply_the_same_declarations_at_once(tmp_path):
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps({f"s{i}": {"task": "tests.noop", "interval_seconds": 60 + i} for i in range(N)}))
    first = apply_all(path)
    assert actions(first) == {"created": N, "unchanged": 2 * N}
    assert Schedule.objects.filter(declared__isnull=False).count() == N
    creates = Counter(AuditEntry.objects.filter(action="create").values_list("target", flat=True))
    assert len(creates) == N and set(creates.values()) == {1}

    path.write_text(json.dumps({f"s{i}": {"task": "tests.noop", "cron": f"{i} 3 * * *"} for i in range(N)}))
    second = apply_all(path)
    assert actions(second) == {"updated": N, "unchanged": 2 * N}
    updates = Counter(AuditEntry.objects.filter(action="update").values_list("target", flat=True))
    assert len(updates) == N and set(updates.values()) == {1}
    assert set(Schedule.objects.values_list("version", flat=True)) == {2}

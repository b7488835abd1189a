"""Chaos: workers SIGKILLed at random while draining; nothing lost, nothing doubled unexplained.

Marked ``slow``; sized to stay well under two minutes per database on a
small machine. ``bench/chaos.py`` runs the same harness with bigger knobs.
"""

from __future__ import annotations

import pytest

from tests.chaos.harness import ChaosConfig, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_killing_workers_at_random_loses_nothing(tmp_path, capsys):
    result = run_chaos(
        ChaosConfig(runs=240, interval_schedules=3, window=15, workers=3, tickers=2), log_dir=tmp_path, say=print
    )
    line = result.summary()
    print(line)
    with capsys.disabled():  # the summary shows in CI output even without -s
        print(f"\n{line}")
    assert not result.problems, "\n".join([line, *result.problems, result.log_tails()])
    assert result.kills >= 2, f"too few kills to mean anything: {line}"
    assert result.executions >= result.runs

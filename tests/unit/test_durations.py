"""One duration helper for the admin and the CLI: a unit that fits the size."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distsched_app.admin.display import duration
from distsched_app.durations import human_duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0, "0 µs"),
        (0.000850, "850 µs"),
        (0.0123, "12.3 ms"),
        (0.5, "500 ms"),
        (4.2149, "4.21 s"),
        (42.5, "42.5 s"),
        (725, "12 min 5 s"),
        (11040, "3 h 4 min"),
        (183600, "2 d 3 h"),
        (-0.25, "-250 ms"),
    ],
)
def test_units_fit_the_size(seconds, text):
    assert human_duration(seconds) == text


def test_timedeltas_and_the_admin_alias():
    assert human_duration(timedelta(milliseconds=1500)) == "1.50 s"
    assert duration is human_duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.00057, "0.57ms"), (0.85, "850ms"), (4.2, "4.2s"), (185, "3m05s"), (7800, "2h10m"),
     (273600, "3d04h"), (-185, "-3m05s")],
)  # fmt: skip
def test_the_cli_keeps_its_compact_spelling_on_the_shared_ladder(seconds, text):
    from distsched_app.management.cli.tables import seconds as cli_seconds

    assert cli_seconds(seconds) == text

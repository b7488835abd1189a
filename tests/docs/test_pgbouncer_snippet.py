"""The PgBouncer settings of docs/postgresql.md, pasted into a settings module, do what the page says."""

from __future__ import annotations

import re
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from distsched_app.db import notify

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "postgresql.md").read_text()


def pgbouncer_snippet() -> str:
    section = PAGE[PAGE.index("## Connections and pooling") : PAGE.index("## Instant wake-ups")]
    [block] = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "LISTEN_DATABASE_URL" in b]
    return block


def test_the_pgbouncer_settings_route_django_through_the_pooler_and_the_listener_past_it(monkeypatch, settings):
    monkeypatch.setenv("DATABASE_URL", "postgres://app@pgbouncer:6432/app")
    monkeypatch.setenv("DISTSCHED_LISTEN_DATABASE_URL", "postgres://app@db:5432/app")
    namespace: dict = {}
    exec(pgbouncer_snippet(), namespace)  # noqa: S102 - the docs' own text, as a user pastes it
    default = namespace["DATABASES"]["default"]
    assert (default["HOST"], default["PORT"], default["DISABLE_SERVER_SIDE_CURSORS"]) == ("pgbouncer", 6432, True)
    settings.DISTSCHED = namespace["DISTSCHED"]
    listener = conninfo_to_dict(notify.conninfo())
    assert (listener["host"], listener["port"], listener["user"]) == ("db", "5432", "app")
    assert listener["dbname"] == settings.DATABASES["default"]["NAME"]  # always Django's (test_... in tests)

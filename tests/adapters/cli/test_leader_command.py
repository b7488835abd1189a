"""``distsched leader [--json]``: who leads now, by the database's clock."""

from __future__ import annotations

import json

import pytest

from distsched_app.models import Leader
from tests.adapters.test_leader_surfaces import elect
from tests.conftest import T0

pytestmark = pytest.mark.django_db


def test_cli_leader_json_when_someone_leads_and_when_nobody_does(cli):
    assert json.loads(cli("leader", "--json")) == {
        "holder": None,
        "pid": None,
        "host": None,
        "since": None,
        "expires_at": None,
        "term": 0,
    }
    assert cli("leader").strip() == "no leader (never elected)"
    elect("tick-a")
    document = json.loads(cli("leader", "--json"))
    assert (document["holder"], document["pid"], document["host"], document["term"]) == ("tick-a", 4242, "host-1", 1)
    assert document["since"].endswith("Z") and document["expires_at"] > document["since"]
    text = cli("leader")
    assert "tick-a" in text and "term" in text
    Leader.objects.update(expires_at=T0)  # long past: the lease ran out
    assert json.loads(cli("leader", "--json"))["holder"] is None
    assert cli("leader").strip() == "no leader (last term 1)"

"""db.bulk: the one row source behind the tick's insert and update and the event insert."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DataError, IntegrityError, connection, transaction

from distsched_app.db import bulk
from distsched_app.models import EventType, Origin, Run, RunEvent, RunState, Schedule
from tests.conftest import T0

pytestmark = pytest.mark.django_db

EVENT_FIELDS = ("run", "event_type", "message", "worker_id", "attempt", "created_at")


def by_column(fields, rows) -> dict:
    return {name: [row[i] for row in rows] for i, name in enumerate(fields)}


def make_run(key: str, schedule: Schedule | None = None) -> Run:
    return Run.objects.create(
        schedule=schedule,
        task_name="tests.noop",
        scheduled_for=T0,
        available_at=T0,
        origin=Origin.MANUAL,
        idempotency_key=key,
        created_at=T0,
        updated_at=T0,
    )


@pytest.fixture
def run(make_schedule):
    return make_run("k", make_schedule("b"))


@pytest.fixture
def sent(monkeypatch) -> list:
    """The parameters of each statement ``db.bulk`` sends through ``server_side_execute`` (PostgreSQL)."""
    calls: list = []
    real = bulk.server_side_execute
    monkeypatch.setattr(
        bulk, "server_side_execute", lambda sql, params, **kw: calls.append(params) or real(sql, params, **kw)
    )
    return calls


@pytest.mark.parametrize("chunk", [500, 3])
def test_insert_rows_writes_every_row_as_given(run, monkeypatch, chunk):
    monkeypatch.setattr(bulk, "ROWS_PER_STATEMENT", chunk)  # SQLite: several statements; PostgreSQL: one
    rows = [(run.pk, EventType.CREATED, f"m{i}", f"w{i}", i, T0 + timedelta(microseconds=i)) for i in range(10)]
    assert bulk.insert_rows(RunEvent, by_column(EVENT_FIELDS, rows)) == []
    stored = RunEvent.objects.order_by("attempt").values_list(
        "run_id", "event_type", "message", "worker_id", "attempt", "created_at"
    )
    assert list(stored) == rows


def test_insert_rows_with_select_binds_orders_and_returns_aware_values(run, monkeypatch):
    monkeypatch.setattr(bulk, "ROWS_PER_STATEMENT", 2)
    slots = [T0 + timedelta(seconds=s) for s in (5, 1, 3)]
    returned = bulk.insert_rows(
        RunEvent,
        {"run": [run.pk] * 3, "created_at": slots},
        select={
            "run": "u.run_id",
            "event_type": bulk.Bind(EventType.SKIPPED),
            "message": "r.task_name",
            "worker_id": "''",
            "attempt": "r.attempts",
            "created_at": "u.created_at",
        },
        join=f"JOIN {bulk.table(Run)} r ON r.id = u.run_id",
        ordered=True,
        returning=("id", "created_at"),
    )
    assert sorted(at for _, at in returned) == sorted(slots)  # aware datetimes, equal to what went in
    by_id = RunEvent.objects.order_by("id").values_list("created_at", "event_type", "message", "attempt")
    assert list(by_id) == [(slot, EventType.SKIPPED, "tests.noop", 0) for slot in slots]  # ids in row order


def test_insert_rows_of_nothing_issues_no_statement(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert bulk.insert_rows(RunEvent, {name: [] for name in EVENT_FIELDS}) == []
        bulk.update_from_rows(Schedule, "id", {"id": [], "next_run_at": []})


def test_columns_of_different_lengths_are_refused(run):
    """PostgreSQL's unnest() would pad the shorter arrays with NULLs."""
    with pytest.raises(ValueError, match="different lengths"):
        bulk.insert_rows(RunEvent, {**by_column(EVENT_FIELDS, [(run.pk, "created", "", "", 0, T0)]), "attempt": []})
    assert not RunEvent.objects.exists()


@pytest.mark.parametrize("chunk", [500, 2])
def test_update_from_rows_sets_each_row_its_own_value(make_schedule, monkeypatch, chunk):
    monkeypatch.setattr(bulk, "ROWS_PER_STATEMENT", chunk)
    schedules = [make_schedule(f"u{i}") for i in range(5)]
    untouched = make_schedule("other").next_run_at
    new = {s.pk: T0 + timedelta(minutes=i, microseconds=7) for i, s in enumerate(schedules)}
    bulk.update_from_rows(Schedule, "id", {"id": list(new), "next_run_at": list(new.values())})
    assert dict(Schedule.objects.filter(pk__in=new).values_list("id", "next_run_at")) == new
    assert Schedule.objects.get(name="other").next_run_at == untouched


def test_a_duplicate_slot_raises_integrity_error(make_schedule):
    schedule = make_schedule("dup")
    slots = {
        "schedule": [schedule.pk, schedule.pk],
        "state": [RunState.PENDING, RunState.PENDING],
        "scheduled_for": [T0, T0],
        "finished_at": [None, None],
        "idempotency_key": ["k1", "k2"],
    }
    select = {
        "schedule": "u.schedule_id",
        "task_name": "''",
        "args": "'[]'",
        "kwargs": "'{}'",
        "state": "u.state",
        "scheduled_for": "u.scheduled_for",
        "available_at": "u.scheduled_for",
        "attempts": "0",
        "max_attempts": "1",
        "finished_at": "u.finished_at",
        "idempotency_key": "u.idempotency_key",
        "queue": "'default'",
        "origin": bulk.Bind(Origin.SCHEDULE),
        "cancel_requested": "false",
        "lease_owner": "''",
        "last_error": "''",
        "created_at": bulk.Bind(T0),
        "updated_at": bulk.Bind(T0),
    }
    with pytest.raises(IntegrityError), transaction.atomic():
        bulk.insert_rows(Run, slots, select=select)
    assert not Run.objects.exists()


@pytest.mark.postgres
def test_postgresql_refuses_a_value_too_long_for_its_column_rather_than_truncating(run):
    """The arrays are cast to the column's type without its length (varchar, not varchar(200)):
    an explicit cast to varchar(200) would silently cut the value, the insert refuses it."""
    with pytest.raises(DataError), transaction.atomic():
        bulk.insert_rows(RunEvent, by_column(EVENT_FIELDS, [(run.pk, EventType.CREATED, "", "w" * 201, 0, T0)]))
    assert not RunEvent.objects.exists()


@pytest.mark.postgres
def test_postgresql_binds_whole_columns_in_one_statement(run, sent):
    rows = [(run.pk, EventType.CREATED, "", "", i, T0) for i in range(1200)]
    bulk.insert_rows(RunEvent, by_column(EVENT_FIELDS, rows))
    assert len(sent) == 1 and len(sent[0]) <= 2 * len(EVENT_FIELDS)  # a handful, whatever the rows
    assert RunEvent.objects.count() == 1200


@pytest.mark.postgres
def test_postgresql_binds_a_repeated_value_once_and_integers_as_the_arrays_text(run, sent):
    """psycopg packs a list element by element in Python: a column with one value in every row is
    bound as that value, a column of integers as its array's text. Rows come back as given."""
    rows = [(run.pk, EventType.CREATED, "", "w1", i, T0) for i in range(50)]
    bulk.insert_rows(RunEvent, by_column(EVENT_FIELDS, rows))
    [params] = sent
    assert not any(isinstance(p, list) for p in params)  # nothing packed element by element
    assert "{0,1,2," in next(p for p in params if isinstance(p, str) and p.startswith("{"))
    stored = RunEvent.objects.order_by("attempt").values_list(*[f if f != "run" else "run_id" for f in EVENT_FIELDS])
    assert list(stored) == rows


@pytest.mark.postgres
def test_postgresql_keeps_mixed_null_and_boolean_columns_as_given():
    """Not packed as text or as one value: NULLs among values, booleans (not integers), and a
    column whose rows differ."""
    from distsched_app.models import LimitHold

    run_ids = [make_run(f"m{i}").pk for i in range(3)]
    columns = {
        "run": run_ids,
        "limit": ["a", "a", "a"],
        "key": ["x", "y", "x"],
        "attempt": [1, 1, 1],
        "worker_id": ["w", "w", "w"],
        "tight": [True, False, True],
        "stripe": [0, 3, 7],
    }
    bulk.insert_rows(LimitHold, columns)
    stored = LimitHold.objects.order_by("run_id").values_list("run_id", "key", "attempt", "tight", "stripe")
    assert list(stored) == list(
        zip(run_ids, columns["key"], columns["attempt"], columns["tight"], columns["stripe"], strict=True)
    )
    bulk.update_from_rows(Run, "id", {"id": run_ids, "started_at": [None, T0, None]})
    assert list(Run.objects.order_by("id").values_list("started_at", flat=True)) == [None, T0, None]


@pytest.mark.postgres
def test_postgresql_refuses_a_repeated_value_too_long_for_its_column(run):
    """A value bound once for every row is cast without the column's length, as the arrays are."""
    rows = [(run.pk, EventType.CREATED, "", "w" * 201, i, T0) for i in range(2)]
    with pytest.raises(DataError), transaction.atomic():
        bulk.insert_rows(RunEvent, by_column(EVENT_FIELDS, rows))
    assert not RunEvent.objects.exists()


# -- the last statement of an outermost block carries the COMMIT (PostgreSQL) ----------------------


def _events(run_id: int) -> list[tuple]:
    return [(run_id, EventType.CREATED, "last", "", 1, T0)]


def _idle() -> bool:
    from psycopg.pq import TransactionStatus

    return connection.connection.pgconn.transaction_status == TransactionStatus.IDLE


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_only_the_outermost_block_lets_its_last_statement_commit():
    assert not bulk.commits_early()  # no block at all
    with transaction.atomic():
        assert bulk.commits_early()
        with transaction.atomic():
            assert not bulk.commits_early()  # a savepoint: the COMMIT belongs to the caller
        assert bulk.commits_early()
        with pytest.raises(DataError), transaction.atomic():
            bulk.execute("SELECT 1 / 0", [])
        assert bulk.commits_early()  # the savepoint rolled back; the block may still commit


@pytest.mark.postgres
def test_inside_a_callers_transaction_the_last_statement_does_not_commit(run):
    """A test's own transaction (or any caller's) is never committed by a nested block's last statement."""
    with transaction.atomic():
        assert not bulk.commits_early()
        bulk.insert_rows(RunEvent, by_column(EVENT_FIELDS, _events(run.pk)), last=True)
        assert not _idle()
    assert RunEvent.objects.filter(message="last").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_last_statement_and_the_commit_go_together_and_on_commit_callbacks_still_run(run):
    called: list[int] = []
    with transaction.atomic():
        transaction.on_commit(lambda: called.append(1))
        Run.objects.filter(pk=run.pk).update(attempts=1)
        bulk.insert_rows(RunEvent, by_column(EVENT_FIELDS, _events(run.pk)), last=True)
        assert _idle()  # committed by that round trip
        assert called == []  # Django runs the callbacks when the block ends
    assert called == [1]
    assert Run.objects.get(pk=run.pk).attempts == 1 and RunEvent.objects.filter(message="last").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_failing_last_statement_or_commit_rolls_the_whole_block_back(run):
    """The statement fails: the COMMIT behind it is not run. The COMMIT fails (the events' foreign
    key is checked at commit): the server rolled back. Either way the block's earlier write is gone
    and the connection is usable."""
    with pytest.raises(DataError), transaction.atomic():
        Run.objects.filter(pk=run.pk).update(attempts=5)
        bulk.execute("SELECT 1 / 0", [], last=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        Run.objects.filter(pk=run.pk).update(attempts=6)
        bulk.insert_rows(RunEvent, by_column(EVENT_FIELDS, _events(run.pk + 1000)), last=True)
    assert Run.objects.get(pk=run.pk).attempts == 0
    assert not RunEvent.objects.filter(message="last").exists()


def test_the_datetime_adapter_writes_what_django_writes():
    """``bulk.datetime_adapter``'s short cut for UTC datetimes gives Django's own text."""
    from datetime import UTC, datetime, timezone
    from zoneinfo import ZoneInfo

    adapt = bulk.datetime_adapter()
    values = [
        T0,
        datetime(2026, 3, 1, 12, 0, 0, 5, tzinfo=UTC),
        datetime(2026, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=2))),
        datetime(2026, 7, 1, 23, 59, 59, tzinfo=ZoneInfo("Europe/Paris")),
        None,
    ]
    assert [adapt(v) for v in values] == [connection.ops.adapt_datetimefield_value(v) for v in values]

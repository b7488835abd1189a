"""Wake-ups at commit on PostgreSQL: LISTEN/NOTIFY, both sides.

Sending: whoever makes runs claimable now (a tick, a trigger, an enqueue, a
retry due at once, a requeue, leases handed back) calls ``notify(queues)``
inside its transaction. PostgreSQL delivers the notification at commit and
drops it on rollback, so a worker is never woken for a run it cannot see.
One channel, the queue in the payload (a queue name may be longer than the
63 bytes a channel name may have), at most one per queue per transaction.

Listening: ``Listener`` is one psycopg connection of its own (autocommit,
never Django's, which is not thread-safe and may sit behind a pooler) that
has run ``LISTEN``. ``wait`` returns the queues notified, or ``[]`` on a
timeout or an ``interrupt()`` from another thread. PgBouncer in transaction
pooling mode accepts ``LISTEN`` but delivers nothing to the client that asked;
``probe()`` tells by notifying from a second connection (a notification sent
by the listening connection itself comes back to it even through the pooler,
which would prove nothing), so the worker can fall back to polling.
"""

from __future__ import annotations

import select
import socket
import time
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import connection

from ..conf import conf

CHANNEL = "distsched_wakeup"
PROBE_PREFIX = "distsched-probe:"
# Connection parameters passed on to the listener: libpq's, not Django's (pool, server_side_binding, ...).
_LIBPQ_OPTIONS = {
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "connect_timeout", "options", "target_session_attrs",
    "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "passfile", "service",
}  # fmt: skip


def enabled() -> bool:
    """Notifications are sent on PostgreSQL unless ``DISTSCHED["NOTIFY"]`` is off."""
    return connection.vendor == "postgresql" and bool(conf.NOTIFY)


def notify(queues: Iterable[str]) -> None:
    """In the current transaction: runs of ``queues`` are claimable now (delivered at commit)."""
    if not enabled():
        return
    distinct = sorted(set(queues))
    if distinct:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, q) FROM unnest(%s::text[]) AS q", [CHANNEL, distinct])


def listening_supported() -> bool:
    return connection.vendor == "postgresql"


def runs_database() -> str:
    """The name the server gives the database Django's connection is on. Behind a pooler,
    Django's ``NAME`` may be an alias of it; notifications are delivered per database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database()")
        return str(cursor.fetchone()[0])


def conninfo(dbname: str | None = None) -> str:
    """Where the listener connects: ``DISTSCHED["LISTEN_DATABASE_URL"]`` (a direct connection, not a pooler) or
    Django's own parameters, always on ``dbname`` (by default Django's current database name; tests rename
    it: ``test_...``): the database name written in the URL is not used."""
    from psycopg.conninfo import make_conninfo

    settings = connection.settings_dict
    dbname = dbname or settings["NAME"]
    url = conf.LISTEN_DATABASE_URL
    if url:
        return make_conninfo(url, dbname=dbname)
    params: dict[str, Any] = {
        "dbname": dbname, "user": settings.get("USER") or None, "password": settings.get("PASSWORD") or None,
        "host": settings.get("HOST") or None, "port": settings.get("PORT") or None,
    }  # fmt: skip
    params.update({k: v for k, v in (settings.get("OPTIONS") or {}).items() if k in _LIBPQ_OPTIONS})
    return make_conninfo(**{k: v for k, v in params.items() if v not in (None, "")})


class Listener:
    """One listening connection (call ``close()``; ``interrupt()`` is safe from any thread)."""

    def __init__(self, dsn: str, *, connect_timeout: float = 10.0) -> None:
        import psycopg

        self._dsn = dsn
        self._connect_timeout = int(connect_timeout)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.conn = psycopg.connect(
            dsn, autocommit=True, prepare_threshold=None, application_name="distsched-listener",
            connect_timeout=self._connect_timeout, keepalives=1, keepalives_idle=30, keepalives_interval=10,
            keepalives_count=3,
        )  # fmt: skip
        self.conn.execute(f"LISTEN {CHANNEL}")

    def database(self) -> str:
        """The database this connection is on, as the server names it."""
        row = self.conn.execute("SELECT current_database()").fetchone()
        return str(row[0]) if row else ""

    def behind_a_pooler(self) -> bool:
        """The server's backend for this session is not the one the client was told: a pooler is in between."""
        row = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        return row is None or row[0] != self.conn.info.backend_pid

    def probe(self, timeout: float = 2.0) -> bool:
        """Notify from a second connection and see it arrive: False where LISTEN cannot work (PgBouncer in
        transaction pooling mode hands the notification to whichever client its server serves at the time)."""
        import psycopg

        token = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        with psycopg.connect(
            self._dsn, autocommit=True, prepare_threshold=None, application_name="distsched-listener-probe",
            connect_timeout=self._connect_timeout,
        ) as sender:  # fmt: skip
            sender.execute("SELECT pg_notify(%s, %s)", [CHANNEL, token])
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if any(payload == token for payload in self._received(left, include_probes=True)):
                return True
        return False

    def wait(self, timeout: float) -> list[str]:
        """The queues notified (possibly none) within ``timeout`` seconds, or at once if interrupted."""
        return self._received(timeout, include_probes=False)

    def _received(self, timeout: float, *, include_probes: bool) -> list[str]:
        payloads = [n.payload for n in self.conn.notifies(timeout=0)]
        if not payloads:
            ready, _, _ = select.select([self.conn.fileno(), self._wake_r], [], [], timeout)
            if self._wake_r in ready:
                self._drain_wake()
            if self.conn.fileno() in ready:
                payloads = [n.payload for n in self.conn.notifies(timeout=0)]
        return [p for p in payloads if include_probes or not p.startswith(PROBE_PREFIX)]

    def health_check(self) -> None:
        """A round trip, so a dead connection raises now rather than in the middle of a wait."""
        self.conn.execute("SELECT 1")

    def interrupt(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            self._wake_r.close()
            self._wake_w.close()

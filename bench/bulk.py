"""Bulk requeue at scale: 100,000 dead runs among others, requeued by filter as a background job.

    .venv/bin/python bench/bulk.py --db postgres                     # processed here, in the foreground
    .venv/bin/python bench/bulk.py --db postgres --workers 2         # processed by two runworker processes
    .venv/bin/python bench/bulk.py --db sqlite --dead 100000 --others 100000

Loads ``--dead`` dead runs of one task plus ``--others`` runs that must not be touched
(succeeded, and dead runs of another task), then times what an operator does through the API
(``django.test.Client`` as a superuser): the dry run ``POST /api/runs/bulk {"dry_run": true}``, the
``POST`` that creates the job (202), and ``GET /api/runs/bulk/{id}`` while it runs. The job is
processed either here (``services.bulk.process_bulk_actions``, timing every batch's transaction) or
by ``--workers`` real ``runworker`` processes (serving no queue: they only do bulk work). Reports
the total time, runs per second, the longest batch transaction and the longest request; the goal
is that every request and every transaction stays under 1 s. Results go to
``bench/results/bulk-<db>.json`` (``bulk-workers-<db>.json`` with ``--workers``).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import _common as c

NAME = "bulk"
TARGET_MS = 1000


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--dead", type=int, default=100_000, help="Dead runs the filter matches (default %(default)s).")
    p.add_argument("--others", type=int, default=100_000, help="Runs it must leave alone (default %(default)s).")
    p.add_argument("--batch-size", type=int, default=1000, help="Runs per batch when processed here.")
    p.add_argument("--workers", type=int, default=0, help="Process with N runworker processes instead of here.")
    p.add_argument("--timeout", type=float, default=1800, help="Seconds the job may take (default %(default)s).")
    args = p.parse_args()
    with c.scratch_database(NAME, args):
        data: dict[str, Any] = {"db": c.db_version(), "dead": args.dead, "others": args.others}
        data["load_seconds"] = load(args)
        c.analyze()
        client = api_client()
        client.get("/api/runs/bulk")  # warm-up: the first request imports and resolves what the others reuse
        requests: list[tuple[str, float, int]] = []
        body = {"filter": {"state": "dead", "task_name": "tests.noop"}, "action": "requeue"}
        dry = timed(requests, "POST dry run", lambda: post(client, {**body, "dry_run": True}))
        assert dry.json()["count"] == args.dead, dry.content
        created = timed(requests, "POST create (202)", lambda: post(client, body))
        assert created.status_code == 202, created.content
        url = created.json()["url"]
        started = time.perf_counter()
        batches = process(args, client, url, requests)
        total = time.perf_counter() - started
        job = client.get(url).json()
        assert job["state"] == "done" and job["done"] == args.dead, job
        data |= summarise(args, total, batches, requests, job)
        verify(args)
        path = c.write_results(f"{NAME}-workers" if args.workers else NAME, args, data)
        print(f"\nresults: {path}")
    return 0


def load(args) -> float:
    """The runs, by ``bulk_create`` in chunks (a few seconds per 100,000)."""
    from distsched_app.models import Origin, Run, RunState

    t = c.now()
    started = time.perf_counter()
    kinds = [(args.dead, RunState.DEAD, "tests.noop")]
    kinds += [
        (args.others // 2, RunState.SUCCEEDED, "tests.noop"),
        (args.others - args.others // 2, RunState.DEAD, "tests.echo"),
    ]
    made = 0
    for count, state, task in kinds:
        for start in range(0, count, 5000):
            Run.objects.bulk_create(
                [
                    Run(
                        task_name=task, state=state, origin=Origin.ENQUEUED, queue="default", scheduled_for=t,
                        available_at=t, created_at=t, updated_at=t, finished_at=t, attempts=3, max_attempts=3,
                        idempotency_key=f"bench:{made + i}",
                    )
                    for i in range(min(5000, count - start))
                ]
            )  # fmt: skip
            made += min(5000, count - start)
    seconds = time.perf_counter() - started
    print(f"loaded {made:,} runs in {seconds:.1f} s")
    return seconds


def api_client():
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench-password")
    client = Client()
    client.force_login(user)
    return client


def post(client, body: dict[str, Any]):
    return client.post("/api/runs/bulk", json.dumps(body), content_type="application/json")


def timed(requests: list[tuple[str, float, int]], label: str, call):
    started = time.perf_counter()
    response = call()
    requests.append((label, (time.perf_counter() - started) * 1000, response.status_code))
    return response


def process(args, client, url: str, requests: list[tuple[str, float, int]]) -> list[float]:
    """Run the job to its end; returns each batch's duration (ms) when processed here."""
    from distsched_app.clock import SystemClock
    from distsched_app.services import bulk

    if args.workers:
        for i in range(args.workers):
            c.spawn(
                c.worker_command(worker_id=f"bulk-{i}", poll_interval=0.05, burst=False, extra=["--queues", "none"]),
                c.scratch_dir(NAME) / f"worker-{i}.log",
            )
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            state = timed(requests, "GET progress", lambda: client.get(url)).json()
            print(f"\r{state['done']:,}/{state['matched']:,} {state['state']}", end="", flush=True)
            if state["state"] == "done":
                break
            time.sleep(0.5)
        print()
        c.stop_children()
        return []
    batches: list[float] = []
    last = [time.perf_counter()]

    def tick(job) -> None:
        now = time.perf_counter()
        batches.append((now - last[0]) * 1000)
        last[0] = now
        if len(batches) % 10 == 0:
            timed(requests, "GET progress", lambda: client.get(url))
            print(f"\r{job.done:,}/{job.matched:,}", end="", flush=True)

    bulk.process_bulk_actions(SystemClock(), batch_size=args.batch_size, progress=tick)
    print()
    return batches


def summarise(args, total: float, batches: list[float], requests, job: dict[str, Any]) -> dict[str, Any]:
    by_label: dict[str, list[float]] = {}
    for label, ms, _status in requests:
        by_label.setdefault(label, []).append(ms)
    rows = [[label, len(v), round(max(v), 1), "ok" if max(v) <= TARGET_MS else "MISS"] for label, v in by_label.items()]
    print(c.table(["request", "count", "max ms", f"<= {TARGET_MS} ms"], rows))
    longest_request = max(ms for _, ms, _ in requests)
    out: dict[str, Any] = {
        "processed_by": f"{args.workers} runworker process(es)" if args.workers else "this process (foreground)",
        "total_seconds": round(total, 2),
        "runs_per_second": round(args.dead / total),
        "batches": job["batches"],
        "longest_request_ms": round(longest_request, 1),
        "requests": {label: {"count": len(v), "max_ms": round(max(v), 1)} for label, v in by_label.items()},
    }
    if batches:
        out["batch_ms"] = {
            "p50": round(c.percentile(batches, 50), 1),
            "p95": round(c.percentile(batches, 95), 1),
            "max": round(max(batches), 1),
        }
    print(json.dumps({k: v for k, v in out.items() if k != "requests"}, indent=2))
    return out


def verify(args) -> None:
    """The filter's runs pending, each requeued once; the others untouched."""
    from django.db.models import Count

    from distsched_app.models import EventType, Run, RunEvent, RunState

    states = dict(Run.objects.filter(task_name="tests.noop").values_list("state").annotate(n=Count("pk")))
    assert states.get(RunState.PENDING) == args.dead, states
    assert not Run.objects.filter(task_name="tests.echo").exclude(state=RunState.DEAD).exists()
    assert RunEvent.objects.filter(event_type=EventType.REQUEUED).count() == args.dead


if __name__ == "__main__":
    sys.exit(main())

"""procrastinate's side of ``bench/latency.py`` (PostgreSQL only; imported by procrastinate's
Django autodiscovery when ``BENCH_PROCRASTINATE=1``)."""

from procrastinate.contrib.django import app

from .latency_record import record


@app.task(name="latency_probe", queue="default")
def latency_probe(key: str) -> None:
    record(key)


@app.task(name="noop", queue="default")
def noop() -> None:
    """``bench/peers.py``'s benchmarked no-op."""
    return None

"""The benchmarked task: a module-level no-op, declared with the framework's decorator."""

from .framework import task


@task
def noop() -> None:
    return None


# -- bench/latency.py: each probe writes "<key> <time.time()>" first thing, so every system is timed
# at the same point: the first line of the task body.


@task
def latency_probe(key: str) -> None:
    """The framework task both framework backends run (distsched, django-tasks-db)."""
    from .latency_record import record

    record(key)


def _distsched_probe(context) -> None:
    """A plain distsched task for triggered runs: a schedule's payload is fixed, so the key is the run."""
    from .latency_record import record

    record(f"run:{context.run_id}")


try:
    from distsched_app import task as distsched_task
except ImportError:  # pragma: no cover - distsched is always importable in the benchmark venvs
    pass
else:
    distsched_task("bench.latency_probe_run")(_distsched_probe)

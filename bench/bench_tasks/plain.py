"""django-q2's side of ``bench/peers.py``: a plain module-level no-op, found by its dotted path."""


def noop() -> None:
    return None

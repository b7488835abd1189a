"""Retry delay: exponential, capped, jitter injected (no patching of ``random``)."""

from __future__ import annotations

import pytest

from distsched_app.backoff import retry_delay


def test_doubles_from_base():
    # base * 2**(attempts-1): 10, 20, 40, 80
    assert [retry_delay(n, base=10, cap=3600) for n in (1, 2, 3, 4)] == [10.0, 20.0, 40.0, 80.0]


def test_is_capped():
    # attempt 10 would be 10 * 512 = 5120 s
    assert retry_delay(10, base=10, cap=3600) == 3600.0
    assert retry_delay(9, base=10, cap=3600) == 2560.0


def test_jitter_uses_the_injected_rand():
    # 20 + 20 * 0.5 * 0.5 = 25
    assert retry_delay(2, base=10, cap=3600, jitter=0.5, rand=lambda: 0.5) == 25.0
    assert retry_delay(2, base=10, cap=3600, jitter=0.5, rand=lambda: 0.0) == 20.0


def test_jitter_is_added_after_the_cap():
    # min(10 * 2**19, 3600) = 3600, plus 3600 * 0.1 * 0.5 = 180
    assert retry_delay(20, base=10, cap=3600, jitter=0.1, rand=lambda: 0.5) == 3780.0


def test_no_jitter_never_calls_rand():
    def boom() -> float:
        raise AssertionError("rand must not be called without jitter")

    assert retry_delay(3, base=10, cap=3600, jitter=0.0, rand=boom) == 40.0


def test_default_rand_stays_in_range():
    for _ in range(50):
        assert 20.0 <= retry_delay(2, base=10, cap=3600, jitter=0.5) < 30.0


@pytest.mark.parametrize("attempts", [1024, 1025, 5000, 10**9])
def test_huge_attempts_do_not_overflow(attempts):
    assert retry_delay(attempts, base=10, cap=3600) == 3600.0
    assert retry_delay(attempts, base=10, cap=3600, jitter=0.5, rand=lambda: 0.5) == 4500.0


def test_zero_base_stays_zero():
    assert retry_delay(5000, base=0, cap=3600) == 0.0


def test_returns_a_float():
    assert isinstance(retry_delay(1, base=10, cap=60), float)


@pytest.mark.parametrize(
    ("attempts", "kwargs"),
    [(0, {}), (-1, {}), (1, {"base": -1}), (1, {"cap": -1}), (1, {"jitter": -0.5})],
)
def test_rejects_nonsense(attempts, kwargs):
    args = {"base": 10, "cap": 60, **kwargs}
    with pytest.raises(ValueError):
        retry_delay(attempts, **args)

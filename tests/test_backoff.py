"""Unit: retry and error-wait delays."""

import random

import pytest

from queueworker.backoff import MAX_BACKOFF_SECONDS, backoff, error_wait, retry_delay


@pytest.mark.parametrize("attempt, low, high", [
    (1, 0.9, 1.1), (2, 1.8, 2.2), (5, 14.4, 17.6), (11, 921.6, 1126.4),
    (17, 58982.4, 72089.6), (18, MAX_BACKOFF_SECONDS * 0.9, MAX_BACKOFF_SECONDS), (10_000, MAX_BACKOFF_SECONDS * 0.9, MAX_BACKOFF_SECONDS),
])
def test_retry_delay_doubles_and_caps_at_24h(attempt, low, high):
    rand = random.Random(attempt)
    for _ in range(200):
        assert low <= retry_delay(attempt, rand=rand) <= high


def test_retry_delay_spreads_a_burst():
    delays = {round(retry_delay(3, rand=random.Random(seed)), 6) for seed in range(50)}
    assert len(delays) > 40


def test_retry_delay_rejects_attempt_zero():
    with pytest.raises(ValueError):
        retry_delay(0)


def test_error_wait_grows_and_is_capped():
    rand = random.Random(1)
    assert 0.09 <= error_wait(1, rand=rand) <= 0.11
    assert 0.18 <= error_wait(2, rand=rand) <= 0.22
    assert 9.0 <= error_wait(50, cap=10.0, rand=rand) <= 11.0


def test_backoff_doubles_from_its_base_up_to_its_cap_and_spreads_within_its_range():
    assert [backoff(step, 0.5, 3.0) for step in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff(10**9, 1.0, 30.0) == 30.0 and backoff(-1, 1.0, 30.0) == 1.0
    rand = random.Random(7)
    waits = [backoff(1, 1.0, 30.0, (0.5, 1.0), rand) for _ in range(200)]
    assert all(1.0 <= wait <= 2.0 for wait in waits) and len(set(waits)) > 150


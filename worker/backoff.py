"""Backoff: how long to wait after a run of failures, in one formula for every caller.

`backoff(step, base, cap, spread)` is base·2^step, capped, times a random factor within `spread`
so that many processes that failed together do not all try again at the same instant. Its uses:
a task's retry delay (`retry_delay`), a duty's wait after errors (`error_wait`), an idle worker's
poll interval, a migration waiting for its locks, the supervisor restarting a worker process and
the controller's LISTEN reconnecting.
"""

from __future__ import annotations

import random

MAX_BACKOFF_SECONDS = 24 * 3600.0
JITTER = 0.1
# Beyond 2^64 any base is past any cap; bounding the exponent keeps the float finite.
_MAX_STEP = 64
NO_SPREAD = (1.0, 1.0)


def backoff(step: int, base: float, cap: float, spread: tuple[float, float] = NO_SPREAD,
            rand: random.Random | None = None) -> float:
    """Seconds to wait after `step` + 1 failures in a row (`step` counts from 0): base·2^step,
    at most `cap`, then times a factor drawn uniformly from `spread` (none by default)."""
    raw = min(cap, base * 2.0 ** min(max(step, 0), _MAX_STEP))
    low, high = spread
    return raw if low == high == 1.0 else raw * (rand or random).uniform(low, high)


def retry_delay(attempt: int, base_seconds: float = 1.0, cap_seconds: float = MAX_BACKOFF_SECONDS,
                rand: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based): base·2^(attempt-1),
    capped at `cap_seconds`, then spread ±10% so a burst of failures does not retry in lockstep
    (the spread never pushes past the cap)."""
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    return min(cap_seconds, backoff(attempt - 1, base_seconds, cap_seconds, (1.0 - JITTER, 1.0 + JITTER), rand))


def error_wait(failures: int, cap: float = 10.0, rand: random.Random | None = None) -> float:
    """Seconds to wait before retrying after `failures` consecutive errors (ErrorWait):
    0.1 s doubling per failure, capped, with ±10% jitter so workers do not reconnect in step."""
    return backoff(failures - 1, 0.1, cap, (1.0 - JITTER, 1.0 + JITTER), rand)

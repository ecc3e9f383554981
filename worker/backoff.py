"""Retry delay after a failed attempt: exponential, capped, with jitter."""

from __future__ import annotations

import random

MAX_BACKOFF_SECONDS = 24 * 3600.0
JITTER = 0.1


def retry_delay(attempt: int, base_seconds: float = 1.0, cap_seconds: float = MAX_BACKOFF_SECONDS,
                rand: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based): base·2^(attempt-1),
    capped at `cap_seconds`, then spread ±10% so a burst of failures does not retry in lockstep
    (the spread never pushes past the cap)."""
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    exponent = min(attempt - 1, 64)  # 2**64 seconds is past any cap; avoids float overflow
    raw = min(cap_seconds, base_seconds * (2.0 ** exponent))
    spread = (rand or random).uniform(1.0 - JITTER, 1.0 + JITTER)
    return min(cap_seconds, raw * spread)


def error_wait(failures: int, cap: float = 10.0, rand: random.Random | None = None) -> float:
    """Seconds to wait before retrying after `failures` consecutive errors (ErrorWait):
    0.1 s doubling per failure, capped, with ±10% jitter so workers do not reconnect in step."""
    raw = min(cap, 0.1 * 2.0 ** min(max(failures - 1, 0), 20))
    return raw * (rand or random).uniform(1.0 - JITTER, 1.0 + JITTER)

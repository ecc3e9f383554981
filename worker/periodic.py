"""Running a guarded background pass every so often, as the rescuer and the cleaner do."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import psycopg

from . import metrics


async def run_every(interval: float, one_pass: Callable[[], Awaitable[object]], operation: str,
                    log: logging.Logger) -> None:
    """Calls `one_pass` every `interval` seconds ±20% (so workers rarely meet at its advisory
    lock); a database error is counted and logged, and the next pass comes on schedule."""
    while True:
        await asyncio.sleep(interval * random.uniform(0.8, 1.2))
        try:
            await one_pass()
        except psycopg.Error as exc:
            metrics.DB_ERRORS.labels(operation).inc()
            log.warning("%s pass failed: %s", operation, exc)

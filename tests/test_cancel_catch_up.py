"""A worker whose listener (re)starts listening looks once at every running attempt: a cancellation
notice sent before it listened (a task claimed while the worker started, or while its listener
reconnected) never comes (queueworker.runtime.cancels)."""

from __future__ import annotations

import asyncio

from queueworker.db.lease import FencedRow
from queueworker.runtime.cancels import CancelChecks


class FakeConnection:
    """Answers CANCELLED_LEASES with the attempts given as cancelled; counts the looks."""

    def __init__(self, cancelled: set[tuple[int, int]]):
        self.cancelled = cancelled
        self.looks: list[list[int]] = []

    async def fetch(self, statement, params):
        self.looks.append(list(params.ids))
        return [FencedRow(task_id, token) for task_id, token in zip(params.ids, params.tokens)
                if (task_id, token) in self.cancelled]


def test_catching_up_looks_at_every_running_attempt_once_and_stops_the_cancelled_ones():
    running = [(1, 1), (2, 5), (3, 2)]
    conn, stopped = FakeConnection({(2, 5)}), []
    checks = CancelChecks(conn, lambda key: key in running, lambda: list(running), stopped.append)  # type: ignore[arg-type]
    asyncio.run(checks.step())
    assert conn.looks == [] and stopped == [], "nothing named, nothing looked at"
    checks.catch_up()
    assert checks.wake.is_set()
    asyncio.run(checks.step())
    assert conn.looks == [[1, 2, 3]] and stopped == [(2, 5)]
    asyncio.run(checks.step())
    assert conn.looks == [[1, 2, 3]], "once per catch-up"

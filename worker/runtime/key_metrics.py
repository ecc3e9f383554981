"""The top keys of each keyed queue a worker serves, as Prometheus series, when asked for
(`--key-metrics N`): per queue, the N keys with the most tasks ready, with their tasks ready and
running (`queueworker_key_tasks{queue,key,state}`).

Off by default. A key is an application's value (a tenant, a source, a customer), unbounded in
number: one series per key would let a producer that invents keys grow every scraper's memory, so
the other metrics carry no key label (the workers' key breaker counts, the controller's keys ready
and held, and key slots). With N the series are bounded by N per queue: a key that leaves the top N
loses its series at the next read. Every worker with the setting exports the same keys, read from
the database (`KEY_REPORT`, what `queueworker keys` shows): aggregate with `max by (queue, key)`,
not `sum`. The read counts the queue's unfinished tasks (its cost grows with the backlog), once per
KEY_METRICS_SECONDS per worker: the price of asking for it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from .. import metrics
from ..db.connection import DutyConnection
from ..db.keys import KEY_REPORT, KeyReportParams

log = logging.getLogger("queueworker.key_metrics")

KEY_METRICS_SECONDS = 30.0
STATES = ("ready", "running")


class KeyMetrics:
    """`keyed_queues` says which of the worker's queues are keyed now (the flow duty's view)."""

    def __init__(self, conn: DutyConnection, keyed_queues: Callable[[], Iterable[str]], top: int):
        self._conn = conn
        self._keyed_queues = keyed_queues
        self._top = top
        self._shown: set[tuple[str, str]] = set()  # (queue, key) with series now

    async def step(self) -> float:
        """One read of each keyed queue's top keys; the series of keys no longer among them go."""
        shown: set[tuple[str, str]] = set()
        for queue in sorted(self._keyed_queues()):
            for row in await self._conn.fetch(KEY_REPORT, KeyReportParams(queue=queue, limit=self._top)):
                if not (row.ready or row.running):
                    continue  # a key listed for its setting or its breaker alone
                key = row.key or ""
                metrics.KEY_TASKS.labels(queue, key, "ready").set(row.ready)
                metrics.KEY_TASKS.labels(queue, key, "running").set(row.running)
                shown.add((queue, key))
        for queue, key in self._shown - shown:
            for state in STATES:
                metrics.KEY_TASKS.remove(queue, key, state)
        self._shown = shown
        return KEY_METRICS_SECONDS

"""The controller's read of queue depth and of the leases worker pods hold (queueworker_controller.queuedb). The statements are in depth.sql."""

from __future__ import annotations

from typing import NamedTuple

from .statements import Params, SqlFile

_SQL = SqlFile("depth")


class QueueDepthParams(Params):
    throughput: bool
    cap: int
    queues: list[str]
    lookaheads: list[float | None]


class QueueDepthRow(NamedTuple):
    queue: str
    lookahead: float | None  # as asked: with the queue, the key of the row
    ready: int
    running: int
    retrying: int
    oldest_ready_age: float | None
    blocked: int
    due_soon: int
    finish_rate: float | None  # tasks/s; None without %(throughput)s or when none finished lately
    recent_task_seconds: float | None
    paused: bool
    breaker_open: bool
    rate_per_second: float | None
    max_running: int | None
    mean_task_seconds: float | None


class WorkerLeasesParams(Params):
    namespace: str
    queue: str


class WorkerLeaseRow(NamedTuple):
    pod_name: str
    running: int
    draining: bool
    oldest_lease_age: float


QUEUE_DEPTH = _SQL.statement("queue_depth", QueueDepthParams, QueueDepthRow)
QUEUE_DEPTH_WITHOUT_FLOW = _SQL.statement("queue_depth_without_flow", QueueDepthParams, QueueDepthRow)
QUEUE_DEPTH_WITHOUT_BLOCKED = _SQL.statement("queue_depth_without_blocked", QueueDepthParams, QueueDepthRow)
WORKER_LEASES = _SQL.statement("worker_leases", WorkerLeasesParams, WorkerLeaseRow)

_SQL.check_all_declared()

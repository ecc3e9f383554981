"""What the controller runs against a queue's database (queueworker_controller.queuedb): queue
depth, the leases worker pods hold, and the LISTEN for producers' announcements. The statements
are in depth.sql."""

from __future__ import annotations

from typing import NamedTuple

from .statements import Params, SqlFile

_SQL = SqlFile("depth")


class QueueDepthParams(Params):
    throughput: bool  # also read the recent finish rate and task duration (the throughput floor)
    cap: int  # ready, retrying, blocked and due_soon are counted up to this
    queues: list[str]
    lookaheads: list[float | None]  # one per queue: seconds ahead that due_soon looks, or None


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
    connection_limit: int  # max_connections less the reserved slots
    other_role_connections: int  # client backends of roles other than this login's (by role, not name)
    paused: bool
    breaker_open: bool
    rate_per_second: float | None
    max_running: int | None
    mean_task_seconds: float | None
    key_limited: bool  # the queue has per-key limits (a default, or a key's own)
    key_slots: int | None  # what the keys let run at once: None without per-key limits, or not bounding
    keys_ready: int  # keys with tasks ready (in the sample key_capacity reads)
    keys_held: int  # of those, the paused ones and those behind a breaker in its cooldown


class WorkerLeasesParams(Params):
    namespace: str
    queue: str


class WorkerLeaseRow(NamedTuple):
    pod_name: str
    running: int
    draining: bool
    oldest_lease_age: float | None  # None for a worker that holds no lease


QUEUE_DEPTH = _SQL.statement("queue_depth", QueueDepthParams, QueueDepthRow)
QUEUE_DEPTH_WITHOUT_KEYS = _SQL.statement("queue_depth_without_keys", QueueDepthParams, QueueDepthRow)
QUEUE_DEPTH_WITHOUT_FLOW = _SQL.statement("queue_depth_without_flow", QueueDepthParams, QueueDepthRow)
QUEUE_DEPTH_WITHOUT_BLOCKED = _SQL.statement("queue_depth_without_blocked", QueueDepthParams, QueueDepthRow)
# Newest schema first: a database refuses the newer ones until it is migrated.
QUEUE_DEPTHS_BY_AGE = (QUEUE_DEPTH, QUEUE_DEPTH_WITHOUT_KEYS, QUEUE_DEPTH_WITHOUT_FLOW, QUEUE_DEPTH_WITHOUT_BLOCKED)
WORKER_LEASES = _SQL.statement("worker_leases", WorkerLeasesParams, WorkerLeaseRow)

_SQL.check_all_declared()

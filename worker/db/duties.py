"""The statements of a worker's background duties that keep the queue moving and the history
bounded: rescue, promote, clean (queueworker.runtime.rescuer, .scheduler, .cleaner). The statements
are in duties.sql.

Every worker runs these duties; each statement first tries to lock its duty's row of
queueworker.duty_locks for its transaction, so one worker at a time does the work and the others'
passes cost one lock attempt. A row, not an advisory key: only roles granted UPDATE on the table
can lock it, where any login can take any advisory key."""

from __future__ import annotations

from typing import NamedTuple

from .statements import Params, SqlFile

_SQL = SqlFile("duties")

class RescueParams(Params):
    deadline_grace: float
    limit: int
    worker_ttl: float


class RescueRow(NamedTuple):
    """Whether this worker held the lock (else it did nothing), and the counts of what it did."""

    held: bool
    requeued: int
    failed: int
    reaped: int
    notified: int


class PromoteDueParams(Params):
    limit: int


class PromotedRow(NamedTuple):
    """What was admitted, and in how many seconds the next waiting task is due (None: none waits;
    negative: one is due already, left for the next batch or another worker's pass)."""

    promoted: int
    notified: int
    next_due_in: float | None


class RetentionParams(Params):
    """What the cleaner's statements delete: rows older than `retention_seconds`, at most `limit`
    (1 to 100,000) at a time."""

    retention_seconds: float
    limit: int


class CleanedRow(NamedTuple):
    """A finished task deleted, with its audit rows."""

    id: int


class CleanedRunRow(NamedTuple):
    """A finished run deleted, with its events."""

    id: int


class CleanedQueueEventRow(NamedTuple):
    """A queue event deleted."""

    id: int


class CleanedWatermarkRow(NamedTuple):
    """A stale watermark deleted: the next run that names it starts from nothing."""

    name: str


class CleanedKeyStateRow(NamedTuple):
    """The state of an idle key deleted (its bucket, breaker and health): the key is new again."""

    queue: str


RESCUE = _SQL.statement("rescue", RescueParams, RescueRow)
PROMOTE_DUE = _SQL.statement("promote_due", PromoteDueParams, PromotedRow)
CLEAN_FINISHED = _SQL.statement("clean_finished", RetentionParams, CleanedRow)
CLEAN_RUNS = _SQL.statement("clean_runs", RetentionParams, CleanedRunRow)
CLEAN_QUEUE_EVENTS = _SQL.statement("clean_queue_events", RetentionParams, CleanedQueueEventRow)
CLEAN_WATERMARKS = _SQL.statement("clean_watermarks", RetentionParams, CleanedWatermarkRow)
CLEAN_KEY_STATE = _SQL.statement("clean_key_state", RetentionParams, CleanedKeyStateRow)

_SQL.check_all_declared()

"""The worker's background duties that keep the queue moving: rescue, promote, clean. The statements are in duties.sql."""

from __future__ import annotations

from typing import NamedTuple

from .statements import Params, SqlFile

_SQL = SqlFile("duties")


class RescueParams(Params):
    lock_key: int
    deadline_grace: float
    limit: int
    worker_ttl: float


class RescueRow(NamedTuple):
    held: bool
    requeued: int
    failed: int
    reaped: int
    notified: int


class PromoteDueParams(Params):
    lock_key: int
    limit: int


class PromotedRow(NamedTuple):
    promoted: int
    notified: int
    next_due_in: float


class CleanFinishedParams(Params):
    lock_key: int
    retention_seconds: float
    limit: int


class CleanedRow(NamedTuple):
    id: int


RESCUE = _SQL.statement("rescue", RescueParams, RescueRow)
PROMOTE_DUE = _SQL.statement("promote_due", PromoteDueParams, PromotedRow)
CLEAN_FINISHED = _SQL.statement("clean_finished", CleanFinishedParams, CleanedRow)

_SQL.check_all_declared()

"""The keys of a queue, as `queueworker keys` and the console show them (queueworker.client.keys).
The statements are in keys.sql."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from .statements import Params, SqlFile

_SQL = SqlFile("keys")


class KeyReportParams(Params):
    queue: str
    limit: int


class KeyReportRow(NamedTuple):
    key: str | None  # None: the tasks without a key
    ready: int
    later: int
    blocked: int
    running: int
    ready_since: datetime | None
    weight: float | None  # None: the default of 1
    max_running: int | None  # the key's own cap, else the queue's per-key default; None: no cap
    rate_per_second: float | None  # likewise, with its burst
    burst: int | None
    paused: bool
    paused_until: datetime | None  # None while paused: until resumed
    tokens: int | None  # whole tokens in the key's bucket now; None without a rate
    breaker_state: str | None  # closed, open, half_open; None: the queue has no breaker per key
    failure_streak: int  # failures since the key's last success, as the workers reported them
    last_success_at: datetime | None
    last_failure_at: datetime | None
    keys_total: int
    ready_total: int
    running_total: int


KEY_REPORT = _SQL.statement("key_report", KeyReportParams, KeyReportRow)

_SQL.check_all_declared()

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
    keys_total: int
    ready_total: int
    running_total: int


KEY_REPORT = _SQL.statement("key_report", KeyReportParams, KeyReportRow)

_SQL.check_all_declared()

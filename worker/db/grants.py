"""Queue grants: which queues a producer login may use (queueworker.client.grants). The statements
are in grants.sql."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from .statements import NoParams, Params, SqlFile

_SQL = SqlFile("grants")


class GrantParams(Params):
    role: str
    pattern: str


class GrantedRow(NamedTuple):
    added: bool


class RevokedRow(NamedTuple):
    removed: bool


class QueueGrantRow(NamedTuple):
    role: str
    pattern: str
    granted_by: str
    granted_at: datetime
    role_exists: bool


GRANT_QUEUE = _SQL.statement("grant_queue", GrantParams, GrantedRow)
REVOKE_QUEUE = _SQL.statement("revoke_queue", GrantParams, RevokedRow)
QUEUE_GRANTS = _SQL.statement("queue_grants", NoParams, QueueGrantRow)

_SQL.check_all_declared()

"""Worker-side database connections: few, long-lived, reopened after any failure.

A worker keeps one connection per duty (claiming, completing, housekeeping, listening),
so no duty waits behind another and no pool can give up on a database that restarts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg

from . import metrics

log = logging.getLogger("queueworker.db")

# Keep a stuck server from hanging a worker, and never leave a transaction open while idle.
SESSION_SETTINGS = "-c statement_timeout=30000 -c idle_in_transaction_session_timeout=60000"
CONNECT_TIMEOUT = 10
# How often a statement is re-run at once after meeting a row that moved partitions.
MOVED_ROW_RETRIES = 5


def met_moved_row(exc: BaseException) -> bool:
    """True when a statement failed only because a row it meant to change was moved between
    `tasks_active` and `tasks_finished` by a transaction that committed meanwhile (Postgres
    raises SQLSTATE 40001 for that even in READ COMMITTED). Every statement we run is a single
    fenced autocommit statement, so the fix is to run it again with a fresh snapshot."""
    return isinstance(exc, psycopg.errors.SerializationFailure)


async def connect(dsn: str, application_name: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, application_name=application_name, options=SESSION_SETTINGS,
        connect_timeout=CONNECT_TIMEOUT, keepalives=1, keepalives_idle=10, keepalives_interval=5,
        keepalives_count=3)


class DutyConnection:
    """One autocommit connection, opened on first use and reopened after it breaks."""

    def __init__(self, dsn: str, application_name: str):
        self._dsn = dsn
        self._application_name = application_name
        self._conn: psycopg.AsyncConnection | None = None
        self._lock = asyncio.Lock()

    async def fetch(self, query: str, params: dict[str, Any] | None = None) -> list[tuple]:
        """Runs one statement and returns its rows (empty for statements without rows)."""
        async with self._lock:
            retries = 0
            while True:
                if self._conn is None or self._conn.closed:
                    self._conn = await connect(self._dsn, self._application_name)
                try:
                    cursor = await self._conn.execute(query, params)
                    return await cursor.fetchall() if cursor.description else []
                except psycopg.Error as exc:
                    if self._conn.broken or self._conn.closed:
                        await self._discard()
                    if not met_moved_row(exc) or retries == MOVED_ROW_RETRIES:
                        raise
                    retries += 1
                    metrics.MOVED_ROW_RETRIES.inc()
                    log.debug("%s: re-running a statement that met a moved row", self._application_name)

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except psycopg.Error:
                pass

    async def close(self) -> None:
        async with self._lock:
            await self._discard()

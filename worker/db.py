"""Worker-side database connections: few, long-lived, reopened after any failure.

A worker keeps one connection per duty (claiming, completing, housekeeping, listening),
so no duty waits behind another and no pool can give up on a database that restarts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any, TypeVar

import psycopg
from psycopg.rows import class_row

from . import metrics

log = logging.getLogger("queueworker.db")

# Keep a stuck server from hanging a worker, and never leave a transaction open while idle.
STATEMENT_TIMEOUT_SECONDS = 30
SESSION_SETTINGS = (f"-c statement_timeout={STATEMENT_TIMEOUT_SECONDS * 1000} "
                    "-c idle_in_transaction_session_timeout=60000")
CONNECT_TIMEOUT = 10
# The server's statement_timeout cannot fire for a statement that never reached it (a network
# path that accepts packets and delivers none): the client gives up a little later by itself.
CLIENT_TIMEOUT_SECONDS = STATEMENT_TIMEOUT_SECONDS + 5
# A statement whose connection was severed fails within psycopg's wait interval (0.1 s).
REAP_SECONDS = 2.0
# When the caller is cancelled mid-statement, the statement gets this long to end on its own (a
# healthy server answers in milliseconds) before its connection is severed: so a cancelled
# duty's last statement has really ended, one way or the other, when the cancellation returns.
CANCEL_GRACE_SECONDS = 1.0
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
        keepalives_count=3, tcp_user_timeout=CLIENT_TIMEOUT_SECONDS * 1000)


Row = TypeVar("Row")


class StatementTimedOut(psycopg.OperationalError):
    """No answer within the client-side timeout; the connection was dropped."""


class DutyConnection:
    """One autocommit connection, opened on first use and reopened after it breaks."""

    def __init__(self, dsn: str, application_name: str):
        self._dsn = dsn
        self._application_name = application_name
        self._conn: psycopg.AsyncConnection | None = None
        self._lock = asyncio.Lock()

    async def fetch(self, query: str, params: dict[str, Any] | None = None, row: type[Row] | None = None,
                    timeout: float = CLIENT_TIMEOUT_SECONDS) -> list[Any]:
        """Runs one statement and returns its rows (empty for statements without rows): tuples,
        or instances of `row` built by column name. Gives up after `timeout` seconds, waiting for
        the connection included (StatementTimedOut). A statement that is timed out or cancelled
        midway has its connection severed rather than cancelled politely: psycopg's own
        cancellation waits up to 10 s for an answer, which a hung server never sends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                await self._lock.acquire()
        except TimeoutError:
            raise StatementTimedOut(f"{self._application_name}: the connection stayed busy for {timeout:g} s") from None
        try:
            statement = asyncio.ensure_future(self._run(query, params, row))
            try:
                done, _ = await asyncio.wait({statement}, timeout=max(0.0, deadline - loop.time()))
            except asyncio.CancelledError:
                await asyncio.wait({statement}, timeout=CANCEL_GRACE_SECONDS)
                await self._sever(statement)
                raise
            if not done:
                await self._sever(statement)
                raise StatementTimedOut(f"{self._application_name}: no answer from the database within "
                                        f"{timeout:g} s")
            return statement.result()
        finally:
            self._lock.release()

    async def _sever(self, statement: asyncio.Future) -> None:
        """Shuts the connection's socket down so an unfinished statement fails at once, then drops
        the connection (its state is unknown either way)."""
        conn = self._conn
        if conn is not None and not conn.closed and not statement.done():
            try:
                with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        await asyncio.wait({statement}, timeout=REAP_SECONDS)
        if not statement.done():
            statement.cancel()
        elif not statement.cancelled():
            statement.exception()  # retrieved: the caller gets StatementTimedOut or its cancellation
        await self._discard()

    async def _run(self, query: str, params: dict[str, Any] | None, row: type[Row] | None) -> list[Any]:
        retries = 0
        while True:
            if self._conn is None or self._conn.closed:
                self._conn = await connect(self._dsn, self._application_name)
            try:
                cursor = self._conn.cursor(row_factory=class_row(row)) if row else self._conn.cursor()
                await cursor.execute(query, params)
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
        """Drops the connection (closing never waits for the server, which may be what hangs)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except psycopg.Error:
                pass

    async def close(self) -> None:
        async with self._lock:
            await self._discard()

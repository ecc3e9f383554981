"""Worker-side database connections: few, long-lived, reopened after any failure.

A worker keeps one connection per kind of work (claiming, completing, heartbeating, listening,
and one for the housekeeping duties), so claims, completions and heartbeats never wait behind
each other or behind housekeeping, and no pool can give up on a database that restarts.
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
        # How long a statement whose caller was cancelled may take to end on its own (lowered
        # when a shutdown has less time left than that).
        self.cancel_grace = CANCEL_GRACE_SECONDS

    async def fetch(self, query: str, params: dict[str, Any] | None = None, row: type[Row] | None = None,
                    timeout: float = CLIENT_TIMEOUT_SECONDS) -> list[Any]:
        """Runs one statement and returns its rows (empty for statements without rows): tuples,
        or instances of `row` built by column name. Gives up after `timeout` seconds, waiting for
        the connection and connecting included (StatementTimedOut). A statement that is timed out
        or cancelled midway has its connection severed rather than cancelled politely: psycopg's
        own cancellation waits up to 10 s for an answer, which a hung server never sends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                await self._lock.acquire()
        except TimeoutError:
            raise StatementTimedOut(f"{self._application_name}: the connection stayed busy for {timeout:g} s") from None
        try:
            retries = 0
            while True:
                conn = await self._connection(deadline, timeout)
                statement = asyncio.ensure_future(_execute(conn, query, params, row))
                try:
                    done, _ = await asyncio.wait({statement}, timeout=max(0.0, deadline - loop.time()))
                except asyncio.CancelledError:
                    try:
                        await asyncio.wait({statement}, timeout=self.cancel_grace)
                    finally:
                        self._abandon(conn, statement)  # runs even if cancelled again meanwhile
                    raise
                if not done:
                    self._abandon(conn, statement)
                    raise StatementTimedOut(f"{self._application_name}: no answer from the database within "
                                            f"{timeout:g} s")
                try:
                    return statement.result()
                except psycopg.Error as exc:
                    if conn.broken or conn.closed:
                        await self._discard()
                    if not met_moved_row(exc) or retries == MOVED_ROW_RETRIES:
                        raise
                    retries += 1
                    metrics.MOVED_ROW_RETRIES.inc()
                    log.debug("%s: re-running a statement that met a moved row", self._application_name)
        finally:
            self._lock.release()

    async def _connection(self, deadline: float, timeout: float) -> psycopg.AsyncConnection:
        """The open connection, made first if needed (cancelling a connect is always safe)."""
        if self._conn is None or self._conn.closed:
            try:
                async with asyncio.timeout_at(deadline):
                    self._conn = await connect(self._dsn, self._application_name)
            except TimeoutError:
                raise StatementTimedOut(f"{self._application_name}: could not connect within {timeout:g} s") from None
        return self._conn

    def _abandon(self, conn: psycopg.AsyncConnection, statement: asyncio.Future) -> None:
        """Gives up on a statement: if it is still running, shuts its connection's socket down so
        it fails at once (within psycopg's 0.1 s wait interval). Either way the connection is
        dropped, and closed once the statement has ended. Synchronous, so that no second
        cancellation can skip it."""
        if self._conn is conn:
            self._conn = None
        if not statement.done() and not conn.closed:
            try:
                with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def ended(_: asyncio.Future) -> None:
            if not statement.cancelled():
                statement.exception()  # seen: the caller got a timeout or a cancellation instead
            conn.pgconn.finish()
        statement.add_done_callback(ended)

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


async def _execute(conn: psycopg.AsyncConnection, query: str, params: dict[str, Any] | None,
                   row: type[Row] | None) -> list[Any]:
    cursor = conn.cursor(row_factory=class_row(row)) if row else conn.cursor()
    await cursor.execute(query, params)
    return await cursor.fetchall() if cursor.description else []

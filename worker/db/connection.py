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
from typing import Any

import psycopg

from .. import dsn as dsn_text
from .. import metrics
from . import statements
from .statements import P, R, Bound, Statement, typed_rows  # noqa: F401  typed_rows: TRANSITIONAL

log = logging.getLogger("queueworker.db")

# Keep a stuck server from hanging a worker, and never leave a transaction open while idle.
STATEMENT_TIMEOUT_SECONDS = 30
# A prepared statement is still planned for its parameters every time: a generic CLAIM plan read
# twice the buffers and ran 5x slower when it was forced, so Postgres is not left to pick one.
SESSION_SETTINGS = (f"-c statement_timeout={STATEMENT_TIMEOUT_SECONDS * 1000} "
                    "-c idle_in_transaction_session_timeout=60000 -c plan_cache_mode=force_custom_plan")
CONNECT_TIMEOUT = 10
# The server's statement_timeout cannot fire for a statement that never reached it (a network
# path that accepts packets and delivers none): the client gives up a little later by itself.
CLIENT_TIMEOUT_SECONDS = STATEMENT_TIMEOUT_SECONDS + 5
# How often a statement is re-run at once after meeting a row that moved partitions.
MOVED_ROW_RETRIES = 5


def met_moved_row(exc: BaseException) -> bool:
    """True when a statement failed only because a row it meant to change was moved between
    `tasks_active` and `tasks_finished` by a transaction that committed meanwhile (Postgres
    raises SQLSTATE 40001 for that even in READ COMMITTED). Every statement we run is a single
    fenced autocommit statement, so the fix is to run it again with a fresh snapshot."""
    return isinstance(exc, psycopg.errors.SerializationFailure)


# Statements are not prepared on connections that may go through a PgBouncer in transaction
# pooling mode: there each transaction may run on another server connection, where a statement
# prepared by another client exists under the same name or ours does not.
NEVER_PREPARE: dict[str, Any] = {"prepare_threshold": None}
# A worker's own connections prepare their statements on their second run (psycopg's
# prepare_threshold counts earlier runs), when the server took the startup options: a PgBouncer
# refuses those, so a connection through one never prepares. Parsing the claim or a completion
# costs the server ~0.3 ms each time, as much as planning it.
PREPARE_AFTER_RUNS = 1
# Databases (connection URLs) whose server refused the `options` startup parameter.
_OPTIONS_REFUSED: set[str] = set()


async def connect(dsn: str, application_name: str, durable_commits: bool = True,
                  prepare: bool = False) -> psycopg.AsyncConnection:
    """A worker connection. Without `durable_commits`, its commits return before their WAL reaches
    the disk (synchronous_commit off): for statements whose loss in a crash harms nothing. With
    `prepare`, repeated statements are prepared unless the server refused the startup options."""
    options = SESSION_SETTINGS if durable_commits else SESSION_SETTINGS + " -c synchronous_commit=off"
    return await connect_with_options(
        dsn, options, autocommit=True, **({"prepare_threshold": PREPARE_AFTER_RUNS} if prepare else {}),
        application_name=application_name,
        connect_timeout=CONNECT_TIMEOUT, keepalives=1, keepalives_idle=10, keepalives_interval=5,
        keepalives_count=3, tcp_user_timeout=CLIENT_TIMEOUT_SECONDS * 1000)


async def connect_with_options(dsn: str, options: str, **parameters: Any) -> psycopg.AsyncConnection:
    """An AsyncConnection with the session settings in `options` (`-c name=value ...`), or without
    them where the server refuses that startup parameter: PgBouncer (1.18 at least) forwards only
    application_name, client_encoding, DateStyle, TimeZone and standard_conforming_strings, and
    turns a connection asking for more away. There the timeouts must come from the database role
    or from PgBouncer itself (docs/deploying.md, "PgBouncer"); the client-side deadlines of every
    statement still hold, and statements are never prepared there (PgBouncer in transaction mode
    would run them on server connections that do not have them). Said once per database; later
    connections skip the refused attempt."""
    if dsn not in _OPTIONS_REFUSED:
        try:
            return await psycopg.AsyncConnection.connect(dsn, options=options, **{**NEVER_PREPARE, **parameters})
        except psycopg.OperationalError as exc:
            if "unsupported startup parameter: options" not in str(exc):
                raise
        _OPTIONS_REFUSED.add(dsn)
        log.warning("the server at %s refuses startup options (a PgBouncer?): connecting without them, so "
                    "statement_timeout and idle_in_transaction_session_timeout come from the database role or "
                    "the pooler", dsn_text.describe(dsn))
    return await psycopg.AsyncConnection.connect(dsn, **{**parameters, **NEVER_PREPARE})


class StatementTimedOut(psycopg.OperationalError):
    """No answer within the client-side timeout; the connection was dropped."""


class DutyConnection:
    """One autocommit connection, opened on first use and reopened after it breaks.

    A statement that gets no answer by its deadline has its connection's socket shut down, so it
    fails at once and the connection is dropped: the server's statement_timeout cannot fire for a
    statement that never reached it, and psycopg's polite cancellation would wait up to 10 s for
    an answer a hung server never sends. `sever()` does the same on demand (shutdown, when the
    database is known to be unresponsive), so that cancelling the caller is quick too."""

    def __init__(self, dsn: str, application_name: str, durable_commits: bool = True, prepare: bool = False):
        self._dsn = dsn
        self._application_name = application_name
        self._durable_commits = durable_commits
        self._prepare = prepare
        self._conn: psycopg.AsyncConnection | None = None
        self._lock = asyncio.Lock()

    async def fetch(self, statement: Statement[P, R], params: P = None, row: Any = None, *,  # TRANSITIONAL defaults
                    timeout: float = CLIENT_TIMEOUT_SECONDS, lock: Bound | None = None) -> list[R]:
        """Runs one statement and returns its rows. Gives up after `timeout` seconds, waiting for the
        connection and connecting included (StatementTimedOut).

        With `lock`, that statement runs first, in one transaction with `statement`, which then
        starts once the lock is held, so its snapshot sees whatever the previous holder committed. A
        lock taken inside the statement itself would not: it would go on reading from the snapshot
        it took before waiting."""
        return await self._within_deadline(timeout, statement, params, lock, row)

    async def execute(self, statement: Statement[P, Any], params: P, *,
                      timeout: float = CLIENT_TIMEOUT_SECONDS) -> None:
        """Runs one statement for its effect, as `fetch` does."""
        await self._within_deadline(timeout, statement, params, None)

    async def _within_deadline(self, timeout: float, statement: Statement[P, R], params: P,
                               lock: Bound | None, row: Any = None) -> list[R]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._lock.locked():
            try:
                async with asyncio.timeout_at(deadline):
                    await self._lock.acquire()
            except TimeoutError:
                raise StatementTimedOut(f"{self._application_name}: the connection stayed busy for "
                                        f"{timeout:.1f} s") from None
        else:
            await self._lock.acquire()  # free: returns at once
        try:
            conn = await self._connection(deadline, timeout)
            expiry = loop.call_at(deadline, shut_down, conn)
            try:
                return await self._run(conn, statement, params, lock, row)
            except psycopg.Error:
                if loop.time() < deadline:
                    raise
                raise StatementTimedOut(f"{self._application_name}: no answer from the database within "
                                        f"{timeout:.1f} s") from None
            finally:
                expiry.cancel()
        finally:
            self._lock.release()

    async def open(self, timeout: float = CLIENT_TIMEOUT_SECONDS) -> None:
        """Connects now, unless connected (StatementTimedOut after `timeout` seconds)."""
        async with self._lock:
            await self._connection(asyncio.get_running_loop().time() + timeout, timeout)

    async def _connection(self, deadline: float, timeout: float) -> psycopg.AsyncConnection:
        """The open connection, made first if needed (cancelling a connect is always safe)."""
        if self._conn is None or self._conn.closed:
            try:
                async with asyncio.timeout_at(deadline):
                    self._conn = await connect(self._dsn, self._application_name, self._durable_commits,
                                               self._prepare)
            except TimeoutError:
                raise StatementTimedOut(f"{self._application_name}: could not connect within {timeout:.1f} s") from None
        return self._conn

    async def _run(self, conn: psycopg.AsyncConnection, statement: Statement[P, R], params: P,
                   lock: Bound | None, row: Any = None) -> list[R]:
        retries = 0
        while True:
            try:
                if isinstance(statement, str):  # TRANSITIONAL: untyped callers, until each is converted
                    if lock is None:
                        return await _untyped_rows(conn, statement, params, row)
                    async with conn.transaction():
                        await conn.execute(lock, params)
                        return await _untyped_rows(conn, statement, params, row)
                if lock is None:
                    return await _rows(conn, statement, params)
                async with conn.transaction():
                    await statements.execute_async(conn, lock.statement, lock.params, prepare=None)
                    return await _rows(conn, statement, params)
            except psycopg.Error as exc:
                if conn.broken or conn.closed:
                    await self._discard()
                if not met_moved_row(exc) or retries == MOVED_ROW_RETRIES:
                    raise
                retries += 1
                metrics.MOVED_ROW_RETRIES.inc()
                log.debug("%s: re-running a statement that met a moved row", self._application_name)

    def sever(self) -> None:
        """Makes a statement under way fail at once (its socket is shut down): for a shutdown that
        knows the database is not answering, before it cancels the duties waiting on it."""
        if self._conn is not None:
            shut_down(self._conn)

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


async def _rows(conn: psycopg.AsyncConnection, statement: Statement[P, R], params: P) -> list[R]:
    """The statement's rows, or none for a statement run for its effect; prepared as the
    connection's `prepare_threshold` says."""
    if statement.row is None:
        await statements.execute_async(conn, statement, params, prepare=None)
        return []
    return await statements.fetch_async(conn, statement, params, prepare=None)


async def _untyped_rows(conn: psycopg.AsyncConnection, query: str, params: Any, row: Any) -> list[Any]:
    """TRANSITIONAL: the old untyped path, until every caller runs a Statement."""
    cursor = conn.cursor(row_factory=typed_rows(row)) if row else conn.cursor()
    await cursor.execute(query, params)
    return await cursor.fetchall() if cursor.description else []


def shut_down(conn: psycopg.AsyncConnection) -> None:
    """Shuts a connection's socket down (without closing the descriptor psycopg waits on): the
    statement waiting on it fails within psycopg's 0.1 s wait interval, and the connection is
    broken, so its owner drops it."""
    if conn.closed:
        return
    try:
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass

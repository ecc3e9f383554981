"""Reading queue depth and worker leases from Postgres, without letting one database hold up the rest.

Every distinct database (connection URL) gets a `Database` of its own: at most POOL_SIZE
connections, one LISTEN connection on the producers' NOTIFY channel, and coalesced depth reads
(QueueWorkers that poll it at about the same moment share one `QUEUE_DEPTH` query). Everything is
asyncio (psycopg's AsyncConnection): no thread pool is shared with other databases or with the
Kubernetes calls, so a database that hangs only delays the QueueWorkers that use it.

Nothing waits without a bound. Connections and deadlines are the worker's own helpers
(queueworker.db.connection), with the controller's shorter timeouts: `connect_timeout` covers the
TCP connect, the startup and the authentication; every statement has a client-side deadline on top
of the server's `statement_timeout`, because a server that hangs after the startup (or a proxy in
front of a dead one) never enforces its own timeout. At the deadline the connection's socket is
shut down, which wakes psycopg with an error at once; a cancel request would have to reach the
same hung server. TCP keepalives and `tcp_user_timeout` notice a peer that vanished without
closing the connection.

`Database`s are reference counted by the QueueWorkers bound to them (`bind`/`release`): when the
last one goes (deleted, or its Secret now names another database) the pool and the listener are
closed. A NOTIFY is passed to the QueueWorkers bound to its queue (their `notify` callback, with the
time the tasks are due: 0 for now), and nothing is kept for other queues, so a producer announcing
arbitrary queue names cannot grow the controller's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

import psycopg
from queueworker import dsn as dsn_text
from queueworker.backoff import backoff
from queueworker.db import connection as db
from queueworker.db.depth import (
    QUEUE_DEPTHS_BY_AGE, WORKER_LEASES, QueueDepthParams, QueueDepthRow, WorkerLeasesParams,
)
from queueworker.db.notify import LISTEN_ANNOUNCEMENTS
from queueworker.db.statements import NO_PARAMS, P, R, Statement
from queueworker.events import parse_announcement
from queueworker.db.notify import LISTEN_CHECK_SECONDS, notifications_arrive
from queueworker.scaling.policy import QueueDepth

from .connector import READ_BUDGET_BYTES, Connector

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 3
STATEMENT_TIMEOUT_MS = 2000
# Client-side bound on one statement: the server's statement_timeout plus a round trip.
STATEMENT_DEADLINE_SECONDS = STATEMENT_TIMEOUT_MS / 1000 + 2
# After the socket is shut down, how long a statement may take to notice before it is abandoned.
ABANDON_SECONDS = 1.0
POOL_SIZE = 2
# The controller's own connections to a database (its pool and its LISTEN connection): taken from the
# budget its QueueWorkers' workers share.
CONTROLLER_CONNECTIONS = POOL_SIZE + 1
# Rows a read may return (worker_leases says LIMIT 1000); a depth read returns one row per queue asked.
MAX_ROWS = 1000
# Unacknowledged data this long means the peer is gone.
TCP_USER_TIMEOUT_MS = 15000
# How long a read waits for other QueueWorkers on the same database to join its query.
COALESCE_SECONDS = 0.02
LISTEN_RETRY_MAX_SECONDS = 30
SESSION_SETTINGS = db.session_settings(statement_timeout=STATEMENT_TIMEOUT_MS,
                                       idle_in_transaction_session_timeout=10000)


async def _connect(connector: Connector, application_name: str) -> psycopg.AsyncConnection[Any]:
    return await connector.connect(application_name, SESSION_SETTINGS, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                                   tcp_user_timeout_ms=TCP_USER_TIMEOUT_MS)


async def _within_deadline(conn: psycopg.AsyncConnection[Any], work: Awaitable[Any],
                           seconds: float | None = None) -> Any:
    """Awaits `work` (a statement on `conn`) for at most `seconds` (STATEMENT_DEADLINE_SECONDS);
    past that, the connection's socket is shut down and StatementTimedOut (a secret-free message)
    raised. A cancelled caller returns at once: the pool drops the connection anyway."""
    seconds = STATEMENT_DEADLINE_SECONDS if seconds is None else seconds
    return await db.within_deadline(conn, work, asyncio.get_running_loop().time() + seconds,
                                    lambda: db.StatementTimedOut(f"no answer within {seconds:g}s: timed out"),
                                    abandon_after=ABANDON_SECONDS)


class TooManyRows(psycopg.OperationalError):
    """A read returned more rows than any of the controller's statements can (a server not speaking
    for the queue's schema)."""


@dataclass(frozen=True)
class WorkerLease:
    pod_name: str
    running: int
    draining: bool
    oldest_lease_age_seconds: float | None


Notify = Callable[[float], None]  # told the epoch time new tasks are due at (0: now)


def _ignore(due_epoch: float) -> None:
    pass


class QueueDatabases:
    """Every database the controller reads, keyed by connection URL, kept while a QueueWorker uses it."""

    def __init__(self) -> None:
        self._databases: dict[str, Database] = {}
        self._bindings: dict[Hashable, tuple[str, str]] = {}  # owner -> (dsn, queue)

    def bind(self, owner: Hashable, dsn: str, queue: str, notify: Notify = _ignore) -> None:
        """`owner` (a QueueWorker) now reads `queue` on `dsn`, and hears of tasks announced on it
        through `notify`; whatever it read before is released."""
        if self._bindings.get(owner) == (dsn, queue):
            return
        self.release(owner)
        database = self._databases.get(dsn)
        if database is None:
            database = self._databases[dsn] = Database(dsn)
        database.watch(queue, owner, notify)
        self._bindings[owner] = (dsn, queue)

    def release(self, owner: Hashable) -> None:
        """Forgets `owner`'s binding; a database nobody reads any more is closed."""
        binding = self._bindings.pop(owner, None)
        if binding is None:
            return
        dsn, queue = binding
        database = self._databases[dsn]
        database.unwatch(queue, owner)
        if not database.watched:
            del self._databases[dsn]
            database.close()

    @property
    def open_databases(self) -> int:
        return len(self._databases)

    def _bound(self, dsn: str) -> Database:
        database = self._databases.get(dsn)
        if database is None:
            raise LookupError("no QueueWorker is bound to this database")  # a caller's bug, never the URL
        return database

    async def depth(self, dsn: str, queue: str, cap: int, lookahead_seconds: float | None = None,
                    throughput: bool = False) -> QueueDepth:
        """The queue's depth, ready and retrying counted up to `cap`; tasks due within
        `lookahead_seconds` as `due_soon`; with `throughput`, its recent finish rate and task
        duration. Raises psycopg.Error."""
        return await self._bound(dsn).depth(queue, cap, lookahead_seconds, throughput)

    def listening(self, dsn: str) -> bool:
        """Whether the database's LISTEN connection is up, so that its NOTIFYs reach the QueueWorkers."""
        database = self._databases.get(dsn)
        return database is not None and database.listening

    async def worker_leases(self, dsn: str, namespace: str, queue: str) -> list[WorkerLease]:
        rows = await self._bound(dsn).fetch(WORKER_LEASES, WorkerLeasesParams(namespace=namespace, queue=queue))
        return [WorkerLease(pod_name=row.pod_name, running=row.running, draining=row.draining,
                            oldest_lease_age_seconds=row.oldest_lease_age) for row in rows]

    def close(self) -> None:
        for database in self._databases.values():
            database.close()
        self._databases.clear()
        self._bindings.clear()


class Database:
    """One database: its connections, its LISTEN loop, its depth batches and the queues watched on it."""

    def __init__(self, dsn: str):
        self._dsn = dsn
        self._where = dsn_text.describe(dsn)  # for log lines: never the URL itself
        self._connector = Connector(dsn)
        self._pool = _Pool(self._connector)
        self.watched: dict[str, dict[Hashable, Notify]] = {}  # queue -> owner -> its notify
        self.listening = False
        self._batch: _DepthBatch | None = None
        self._query_lock = asyncio.Lock()  # one depth query at a time on this database
        self._refused_reads: set[str] = set()
        self._listener = asyncio.ensure_future(self._listen())

    def watch(self, queue: str, owner: Hashable, notify: Notify) -> None:
        self.watched.setdefault(queue, {})[owner] = notify

    def unwatch(self, queue: str, owner: Hashable) -> None:
        owners = self.watched.get(queue, {})
        owners.pop(owner, None)
        if not owners:
            self.watched.pop(queue, None)

    def _announce(self, payload: str) -> None:
        """Tells the QueueWorkers of the queue a producer or a scheduler announced tasks on (garbage
        reaches nobody)."""
        announced = parse_announcement(payload)
        if announced is not None:
            queue, due_epoch = announced
            self._notify(self.watched.get(queue, {}), due_epoch)

    @staticmethod
    def _notify(owners: dict[Hashable, Notify], due_epoch: float) -> None:
        for notify in list(owners.values()):
            notify(due_epoch)

    async def depth(self, queue: str, cap: int, lookahead_seconds: float | None, throughput: bool) -> QueueDepth:
        batch = self._batch
        if batch is None or batch.started:
            batch = self._batch = _DepthBatch(self.fetch, self._query_lock, self._refused_reads)
            asyncio.get_running_loop().call_later(COALESCE_SECONDS, batch.start)
        return await batch.add(queue, cap, lookahead_seconds, throughput)

    async def fetch(self, statement: Statement[P, R], params: P) -> list[R]:
        """Reads: one statement on a pooled connection under the client-side deadline. A depth read
        returns one row per queue asked, any other read at most MAX_ROWS."""
        max_rows = len(params.queues) if isinstance(params, QueueDepthParams) else MAX_ROWS
        return await self._run(statement, params, max_rows)

    async def _run(self, statement: Statement[P, R], params: P, max_rows: int = MAX_ROWS) -> list[R]:
        """One statement on a pooled connection under the client-side deadline: its rows, or none
        for a statement run for its effect (the listen check's notification, which is no read).
        Bounded whatever the server sends: in bytes by the connection's relay (ReadTooLarge; its
        budget grows with `max_rows`), and in rows by `max_rows` (TooManyRows)."""
        async with self._pool.connection() as conn:
            self._connector.expect_rows(conn, max_rows)
            try:
                rows = await _within_deadline(conn, db.run_statement(conn, statement, params))
            except psycopg.Error as exc:
                raise self._connector.exceeded(conn) or exc from None
        if len(rows) > max_rows:
            raise TooManyRows(f"the server returned {len(rows)} rows for one read; at most {max_rows}")
        return rows

    async def _listen(self) -> None:
        """Supervised for the database's lifetime: any failure is logged and retried with backoff.
        Ends for good where notifications do not arrive at all: `listening` stays false."""
        failures = 0
        while True:
            try:
                async with await _connect(self._connector, "queueworker-controller-listen") as conn:
                    if not await _within_deadline(conn, notifications_arrive(conn, self._run),
                                                  LISTEN_CHECK_SECONDS + STATEMENT_DEADLINE_SECONDS):
                        log.warning("notifications do not reach the controller from %s (a PgBouncer in transaction "
                                    "pooling mode?): its QueueWorkers poll at their pollingIntervalSeconds",
                                    self._where)
                        return
                    await _within_deadline(conn, db.run_statement(conn, LISTEN_ANNOUNCEMENTS, NO_PARAMS))
                    failures = 0
                    self.listening = True
                    for owners in list(self.watched.values()):  # what was announced while not listening
                        self._notify(owners, 0.0)
                    while await self._hear(conn):
                        # Past half the relay's budget of bytes since the client last spoke, speaking
                        # again (the same LISTEN) starts a new exchange; what was announced meanwhile
                        # is made up for as after a reconnect.
                        await _within_deadline(conn, db.run_statement(conn, LISTEN_ANNOUNCEMENTS, NO_PARAMS))
                        for owners in list(self.watched.values()):
                            self._notify(owners, 0.0)
                self.listening = False
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any error (not cancellation)
                self.listening = False
                failures += 1
                delay = backoff(failures, 1.0, LISTEN_RETRY_MAX_SECONDS)
                log.debug("LISTEN on %s failed (%s); polling only, retrying in %ss", self._where,
                          dsn_text.explain(exc, self._dsn), delay)
                await asyncio.sleep(delay)

    async def _hear(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Passes notifications on until the connection ends (False), or until the server has sent
        half a read budget since the client last spoke (True)."""
        try:
            async for notify in conn.notifies():
                self._announce(notify.payload)
                if self._connector.received(conn) > READ_BUDGET_BYTES // 2:
                    return True
        except psycopg.Error as exc:
            raise self._connector.exceeded(conn) or exc from None
        return False

    def close(self) -> None:
        self._listener.cancel()
        self._pool.close()


class _Pool:
    """At most POOL_SIZE connections to one database, kept idle between uses. A connection that
    errs is dropped, so a restarted server costs one failed query, not a stuck pool."""

    def __init__(self, connector: Connector):
        self._connector = connector
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._slots = asyncio.Semaphore(POOL_SIZE)
        self._closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            if conn is None or conn.closed:
                conn = await _connect(self._connector, "queueworker-controller")
            try:
                yield conn
            except BaseException:
                await conn.close()
                raise
            if self._closed or len(self._idle) >= POOL_SIZE:
                await conn.close()
            else:
                self._idle.append(conn)

    def close(self) -> None:
        """Idle connections close now; those in use close when their statement ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            asyncio.ensure_future(conn.close())


class _DepthBatch:
    """Queues asked for on one database within COALESCE_SECONDS, or while the previous batch's
    query runs, answered by one query: at most one depth query per database at a time."""

    def __init__(self, fetch: Callable[[Statement[QueueDepthParams, QueueDepthRow], QueueDepthParams],
                                       Awaitable[list[QueueDepthRow]]],
                 lock: asyncio.Lock, refused: set[str]):
        self._fetch = fetch
        self._lock = lock
        self._refused = refused  # the database's: statements already reported refused for lack of a grant
        # (queue, lookahead seconds or None) -> the reads waiting for that row
        self._waiters: dict[tuple[str, float | None], list[asyncio.Future[QueueDepth]]] = {}
        self._cap = 1
        self._throughput = False  # any read asked for it: measured once for the whole batch
        self.started = False  # once true, later reads go to a new batch

    def add(self, queue: str, cap: int, lookahead_seconds: float | None, throughput: bool
            ) -> asyncio.Future[QueueDepth]:
        future: asyncio.Future[QueueDepth] = asyncio.get_running_loop().create_future()
        key = (queue, None if lookahead_seconds is None else float(lookahead_seconds))
        self._waiters.setdefault(key, []).append(future)
        self._cap = max(self._cap, cap)
        self._throughput = self._throughput or throughput
        return future

    def start(self) -> None:
        asyncio.ensure_future(self._run())

    async def _read_depths(self) -> list[QueueDepthRow]:
        params = QueueDepthParams(throughput=self._throughput, cap=self._cap,
                                  queues=[queue for queue, _ in self._waiters],
                                  lookaheads=[ahead for _, ahead in self._waiters])
        *newer, oldest = QUEUE_DEPTHS_BY_AGE
        for statement in newer:
            try:
                return await self._fetch(statement, params)
            except (psycopg.errors.UndefinedTable,  # no queueworker.queues there yet
                    psycopg.errors.UndefinedColumn,  # no per-key limits there yet
                    psycopg.errors.UndefinedFunction,  # no queueworker.key_capacity there yet
                    psycopg.errors.InvalidTextRepresentation):  # 'blocked' is not a task state there yet
                continue
            except psycopg.errors.InsufficientPrivilege as exc:
                # Migrated, but docs/database-roles.sql not run again since: an older read may be
                # allowed (without what the newer one adds). Said once per database; if no read is
                # allowed, the oldest one's refusal is the error.
                if statement.name not in self._refused:
                    self._refused.add(statement.name)
                    log.warning("the depth read %s was refused (%s): reading without what it adds; run "
                                "docs/database-roles.sql of this release", statement.name,
                                exc.diag.message_primary or type(exc).__name__)
                continue
        return await self._fetch(oldest, params)

    async def _run(self) -> None:
        try:
            async with self._lock:
                self.started = True
                rows = await self._read_depths()
        except BaseException as exc:  # every waiter gets an outcome, whatever happened here
            error = exc if isinstance(exc, Exception) else psycopg.OperationalError("the depth read was interrupted")
            for futures in self._waiters.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        depths = {(row.queue, row.lookahead): QueueDepth.from_row(row) for row in rows}
        for key, futures in self._waiters.items():
            for future in futures:
                if not future.done():
                    future.set_result(depths[key])


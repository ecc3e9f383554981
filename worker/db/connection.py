"""Database connections that never wait without a bound, for the worker and the controller.

Two helpers serve both: `connect_session` opens an autocommit connection with session settings
(statement_timeout and the like), TCP keepalives and a `tcp_user_timeout`, falling back to no
settings where a pooler refuses them (`connect_with_options`); `within_deadline` runs a statement
under a client-side deadline, at which the connection's socket is shut down (`shut_down`), so the
statement fails at once and is reported as StatementTimedOut. The server's own statement_timeout
cannot fire for a statement that never reached it, and a cancel request would have to reach the
same hung server. Each caller brings its own timeouts: a worker's are generous (a claim may wait
on a busy database), the controller's short (a tick reads many databases).

A worker process holds two `DutyConnection`s (docs/architecture.md, "Two connections per worker
process"): the duty connection runs its claims, heartbeats and housekeeping, and listens for
notifications whenever no statement needs it (`listen_while_idle`); the outcome connection its
completions, checkpoints and releases. So a heartbeat never waits behind a completion, claims and
flushes overlap, and no pool can give up on a database that restarts. The controller pools a few connections per database
(queueworker_controller.queuedb).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import psycopg

from .. import dsn as dsn_text
from .. import metrics
from . import notify, statements
from .statements import P, R, Bound, Statement

log = logging.getLogger("queueworker.db")
T = TypeVar("T")


def session_settings(**settings: object) -> str:
    """The startup `options` that set each of `settings` for the session: `-c name=value ...`."""
    return " ".join(f"-c {name}={value}" for name, value in settings.items())


# Keep a stuck server from hanging a worker, and never leave a transaction open while idle.
STATEMENT_TIMEOUT_SECONDS = 30
# A prepared statement is still planned for its parameters every time: a generic plan of a
# statement that joins on rows picked under a LIMIT is sized for a tenth of the table (a generic
# claim once read twice the buffers and ran 5x slower), so Postgres is not left to pick one. The
# exceptions each ask for a generic plan: the claims that lock no queue (plain and fair), written to
# plan the same whatever their parameters, are functions that carry the setting
# (migrations/functions/35_claims.sql); the claims under a queue's lock, whose planning ran under
# the lock, and the completion of succeeded tasks, whose plan depends on the running tasks, not on
# its parameters, ask for their own transaction (lease.sql, `lock_queue`, `lock_keys`,
# `completion_settings`).
SESSION_SETTINGS = session_settings(statement_timeout=STATEMENT_TIMEOUT_SECONDS * 1000,
                                    idle_in_transaction_session_timeout=60000, plan_cache_mode="force_custom_plan")
CONNECT_TIMEOUT = 10
# The server's statement_timeout cannot fire for a statement that never reached it (a network
# path that accepts packets and delivers none): the client gives up a little later by itself.
CLIENT_TIMEOUT_SECONDS = STATEMENT_TIMEOUT_SECONDS + 5
# How often a statement is re-run at once after meeting a row that moved partitions.
MOVED_ROW_RETRIES = 5
# Notifications a listener passes on per turn at most (DutyConnection.listen_while_idle): a flood
# that piled up during a long statement is passed on slice by slice, the event loop and any
# statement waiting for the connection getting their turn between slices.
PASS_ON_SLICE = 500


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
# A peer that vanished without closing the connection is noticed: an idle connection is probed
# after 10 s of silence, every 5 s, and given up after 3 unanswered probes.
KEEPALIVES: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


async def connect(dsn: str, application_name: str, prepare: bool = False) -> psycopg.AsyncConnection:
    """A worker connection. With `prepare`, repeated statements are prepared unless the server
    refused the startup options."""
    return await connect_session(dsn, application_name, SESSION_SETTINGS, connect_timeout=CONNECT_TIMEOUT,
                                 tcp_user_timeout_ms=CLIENT_TIMEOUT_SECONDS * 1000,
                                 **({"prepare_threshold": PREPARE_AFTER_RUNS} if prepare else {}))


async def connect_session(dsn: str, application_name: str, settings: str, *, connect_timeout: int,
                          tcp_user_timeout_ms: int, database: str | None = None,
                          again: Callable[[], Awaitable[str]] | None = None,
                          **parameters: Any) -> psycopg.AsyncConnection:
    """An autocommit connection with the session `settings` (session_settings; left out where the
    server refuses them: connect_with_options). `connect_timeout` (seconds) bounds the TCP connect,
    the startup and the authentication; the keepalives, and data left unacknowledged for
    `tcp_user_timeout_ms`, tell of a peer that is gone. `database` names the database for
    connect_with_options when `dsn` is one attempt's connection string rather than its URL, and
    `again` gives the connection string of a second attempt (a fresh relay's). `parameters` go to
    psycopg as they are."""
    return await connect_with_options(dsn, settings, autocommit=True, application_name=application_name,
                                      connect_timeout=connect_timeout, **KEEPALIVES,
                                      tcp_user_timeout=tcp_user_timeout_ms, database=database, again=again,
                                      **parameters)


async def connect_with_options(dsn: str, options: str, *, database: str | None = None,
                               again: Callable[[], Awaitable[str]] | None = None,
                               **parameters: Any) -> psycopg.AsyncConnection:
    """An AsyncConnection with the session settings in `options` (`-c name=value ...`), or without
    them where the server refuses that startup parameter: PgBouncer (1.18 at least) forwards only
    application_name, client_encoding, DateStyle, TimeZone and standard_conforming_strings, and
    turns a connection asking for more away. There the timeouts must come from the database role
    or from PgBouncer itself (docs/deploying.md, "PgBouncer"); the client-side deadlines of every
    statement still hold, and statements are never prepared there (PgBouncer in transaction mode
    would run them on server connections that do not have them). Said once per database (`database`,
    by default `dsn`: its URL); later connections skip the refused attempt."""
    database = dsn if database is None else database
    if database not in _OPTIONS_REFUSED:
        try:
            return await psycopg.AsyncConnection.connect(dsn, options=options, **{**NEVER_PREPARE, **parameters})
        except psycopg.OperationalError as exc:
            if "unsupported startup parameter: options" not in str(exc):
                raise
        _OPTIONS_REFUSED.add(database)
        log.warning("the server at %s refuses startup options (a PgBouncer?): connecting without them, so "
                    "statement_timeout and idle_in_transaction_session_timeout come from the database role or "
                    "the pooler", dsn_text.describe(database))
        if again is not None:  # the refused attempt's way to the server is spent
            dsn = await again()
    return await psycopg.AsyncConnection.connect(dsn, **{**parameters, **NEVER_PREPARE})


class StatementTimedOut(psycopg.OperationalError):
    """No answer within the client-side timeout; the connection was dropped. The message names
    the timeout, never the database URL."""


async def within_deadline(conn: psycopg.AsyncConnection, work: Awaitable[T], deadline: float,
                          timed_out: Callable[[], StatementTimedOut], *, abandon_after: float | None = None) -> T:
    """Awaits `work`, a statement on `conn`, until `deadline` (the event loop's clock). At the
    deadline the connection's socket is shut down: the statement fails at once, and `timed_out()`
    is raised instead of its error. The connection is broken then, for its owner to drop.

    Without `abandon_after`, `work` runs in the caller's task: cancelling the caller cancels the
    statement the way psycopg does (a cancel request, then up to 10 s for the server to confirm),
    and the connection stays usable. For a connection kept across cancellations (DutyConnection,
    whose `sever()` is the quick way out when the database is known not to answer).

    With `abandon_after` (seconds), `work` runs in a task of its own and the caller never waits on
    psycopg: cancelled, the caller shuts the socket down and returns at once; past the deadline, it
    raises within `abandon_after` seconds even if the statement has not noticed the shutdown (the
    statement's task is cancelled then). For a connection dropped after any failure (a pool's)."""
    loop = asyncio.get_running_loop()
    if abandon_after is None:
        expiry = loop.call_at(deadline, shut_down, conn)
        try:
            return await work
        except psycopg.Error:
            if loop.time() < deadline:
                raise
            raise timed_out() from None
        finally:
            expiry.cancel()
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=deadline - loop.time())
    except asyncio.CancelledError:
        _abandon(conn, task, abandon_after)
        raise
    if task in done:
        return task.result()
    _abandon(conn, task, abandon_after)
    await asyncio.wait({task}, timeout=abandon_after)
    raise timed_out()


def _abandon(conn: psycopg.AsyncConnection, task: asyncio.Future[Any], cancel_after: float) -> None:
    """Makes the statement on `conn` fail now (shut_down). The task's outcome is collected so it is
    never reported as unretrieved; if psycopg still waits `cancel_after` seconds later, it is cancelled."""
    shut_down(conn)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    asyncio.get_running_loop().call_later(cancel_after, task.cancel)


class DutyConnection:
    """One autocommit connection, opened on first use and reopened after it breaks.

    A statement that gets no answer by its deadline has its connection's socket shut down, so it
    fails at once and the connection is dropped: the server's statement_timeout cannot fire for a
    statement that never reached it, and psycopg's polite cancellation would wait up to 10 s for
    an answer a hung server never sends. `sever()` does the same on demand (shutdown, when the
    database is known to be unresponsive), so that cancelling the caller is quick too."""

    def __init__(self, dsn: str, application_name: str, prepare: bool = False):
        self._dsn = dsn
        self._application_name = application_name
        self._prepare = prepare
        self._conn: psycopg.AsyncConnection | None = None
        self._lock = asyncio.Lock()
        # Which connection this is: one more for each connection opened, so a listener knows when
        # the LISTENs it made went with a connection that was replaced.
        self.generation = 0
        # Statements waiting for the connection while it is held: a listener holding it idle gives
        # it up at once (`_woken`).
        self._statements_waiting = 0
        self._listening = False
        self._woken: asyncio.Future[bool] | None = None
        # Notifications read on the connection, for its listener, each with whether it was read while
        # the connection was idle (not with a statement's answer); which connection keeps them.
        self._received: deque[tuple[psycopg.Notify, bool]] = deque()
        self._keeping = 0
        # The idle clock (idle_seconds): the time the listener has waited on the idle connection, in
        # all, and since when it waits now (event-loop time; None while it does not).
        self._idle_total = 0.0
        self._idle_since: float | None = None
        self._resting = asyncio.Event()  # set while it waits (idle_for)

    async def fetch(self, statement: Statement[P, R], params: P, *, timeout: float = CLIENT_TIMEOUT_SECONDS,
                    first: Bound | None = None) -> list[R]:
        """Runs one statement and returns its rows. Gives up after `timeout` seconds, waiting for the
        connection and connecting included (StatementTimedOut).

        With `first`, that statement runs first, in one transaction with `statement`: a lock, or a
        setting for the transaction (lease.sql, `completion_settings`). After a lock,
        `statement` starts once the lock is held, so its snapshot sees whatever the previous holder
        committed. A lock taken inside the statement itself would not: it would go on reading from
        the snapshot it took before waiting. Both are sent at once and committed by the server
        without waiting for the client (statements.fetch_after_lock_async): the lock is held for
        the server's work alone, never across a round trip."""
        return await self._within_deadline(timeout, statement, params, first)

    async def execute(self, statement: Statement[P, Any], params: P, *,
                      timeout: float = CLIENT_TIMEOUT_SECONDS) -> None:
        """Runs one statement for its effect, as `fetch` does."""
        await self._within_deadline(timeout, statement, params, None)

    async def _within_deadline(self, timeout: float, statement: Statement[P, R], params: P,
                               first: Bound | None) -> list[R]:
        return await self.using(lambda conn: self._run(conn, statement, params, first), timeout=timeout)

    async def _acquire(self, deadline: float, timeout: float) -> None:
        """Takes the connection for one `using` (a statement's too), waiting until `deadline` at
        most; a listener holding it idle hands it over at once. Counted as waiting from the
        start: a listener that is granted the connection before us (asyncio.Lock hands it over
        before its holder runs again) must find us waiting and give it up."""
        self._statements_waiting += 1
        try:
            if self._woken is not None and not self._woken.done():
                self._woken.set_result(False)
            async with asyncio.timeout_at(deadline):
                await self._lock.acquire()
        except TimeoutError:
            raise StatementTimedOut(f"{self._application_name}: the connection stayed busy for "
                                    f"{timeout:.1f} s") from None
        finally:
            self._statements_waiting -= 1

    @property
    def listening(self) -> bool:
        """Whether a listener waits on the connection now (listen_while_idle)."""
        return self._listening

    def busy(self) -> bool:
        """Whether a statement runs on the connection now (a listener waiting idle on it is not one)."""
        return self._lock.locked() and not self._listening

    async def using(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]], *,
                    timeout: float = CLIENT_TIMEOUT_SECONDS) -> T:
        """Runs `work` on the connection itself, alone on it and within `timeout` seconds, waiting
        for the connection and connecting included (StatementTimedOut): every statement runs this
        way, and what is not a declared statement (LISTEN, UNLISTEN) too. A connection that `work`
        breaks is dropped."""
        deadline = asyncio.get_running_loop().time() + timeout
        await self._acquire(deadline, timeout)
        try:
            conn = await self._connection(deadline, timeout)
            try:
                return await within_deadline(conn, work(conn), deadline, lambda: StatementTimedOut(
                    f"{self._application_name}: no answer from the database within {timeout:.1f} s"))
            except psycopg.Error:
                if conn.broken or conn.closed:
                    await self._discard()
                raise
        finally:
            self._lock.release()

    async def listen(self, channels: Iterable[str]) -> int:
        """LISTENs on `channels`; returns which connection listens (its generation), for
        listen_while_idle. From then on psycopg keeps every notification it reads, during
        statements too, for the listener (a notify handler that only keeps it: an error of the
        listener's own must never break the statement under way)."""
        async def subscribe(conn: psycopg.AsyncConnection) -> int:
            if self._keeping != self.generation:
                self._received.clear()
                conn.add_notify_handler(self._keep_answered)
                self._keeping = self.generation
            for channel in channels:
                await notify.listen(conn, channel)
            return self.generation
        return await self.using(subscribe)

    async def listen_while_idle(self, generation: int,
                                on_notify: Callable[[psycopg.Notify, bool], None]) -> None:
        """Passes the notifications of the connection `generation` (which `listen` made listen) to
        `on_notify`, each with whether it was read while the connection was idle (through a pooler
        in transaction mode, one that came with a statement's answer may be another session's: the
        server connection the statement ran on): whenever it gets its turn, those read during the
        statements before, and while no statement needs the connection, it waits on it for more; a
        statement that wants it gets it at once. Returns when that connection is gone (closed, or
        replaced after it broke): its LISTENs went with it. Raises the connection's error when it
        breaks while waiting (it is dropped), and whatever `on_notify` raises."""
        conn = self._conn
        if conn is None or conn.closed or self.generation != generation:
            return
        while await self._wait_idle(conn, on_notify):
            await asyncio.sleep(0)  # a turn for the loop: taking a free lock does not yield

    async def _wait_idle(self, conn: psycopg.AsyncConnection,
                         on_notify: Callable[[psycopg.Notify, bool], None]) -> bool:
        """Once the connection is free: waits on it until a statement wants it or the server sends
        something, and passes on the notifications that came. False once `conn` is not the open
        connection any more."""
        await self._lock.acquire()
        try:
            if self._conn is not conn or conn.closed:
                return False
            if self._pass_on(on_notify) or self._statements_waiting:
                return True  # more to pass on next turn; or statements queued before us get the lock first
            self._listening = True
            if await self._readable_or_wanted(conn):
                try:
                    receive_notifications(conn, self._keep_idle)
                except psycopg.Error:
                    await self._discard()
                    raise
                self._pass_on(on_notify)
            return True
        finally:
            self._listening = False
            self._lock.release()

    def idle_seconds(self) -> float:
        """A clock that runs only while the listener waits on the idle connection: how long a
        notification could have been read there while idle, the proof the listener's check wants
        (queueworker.runtime.listener). A connection kept busy by statements barely moves it."""
        waiting = 0.0 if self._idle_since is None else asyncio.get_running_loop().time() - self._idle_since
        return self._idle_total + waiting

    async def idle_for(self, seconds: float) -> None:
        """Returns once the listener has waited on the idle connection for `seconds` without a
        statement in between: the connection rests (a worker out of work), it is not between two
        statements of a busy one."""
        loop = asyncio.get_running_loop()
        while True:
            await self._resting.wait()
            since = self._idle_since
            if since is None:
                continue
            await asyncio.sleep(since + seconds - loop.time())
            if self._idle_since == since:
                return

    def _pass_on(self, on_notify: Callable[[psycopg.Notify, bool], None]) -> bool:
        """Passes on the kept notifications, PASS_ON_SLICE at most; whether some are left."""
        for _ in range(min(len(self._received), PASS_ON_SLICE)):
            on_notify(*self._received.popleft())
        return bool(self._received)

    def _keep_answered(self, notify: psycopg.Notify) -> None:
        """psycopg's handler: a notification read with a statement's answer."""
        self._received.append((notify, False))

    def _keep_idle(self, notify: psycopg.Notify) -> None:
        """The listener's reader (receive_notifications): a notification read while idle."""
        self._received.append((notify, True))

    async def _readable_or_wanted(self, conn: psycopg.AsyncConnection) -> bool:
        """Waits until the server sends something on the idle `conn` (True) or a statement wants the
        connection (False). A plain wait on the socket, with nothing under way on the connection:
        no task to start or cancel for each statement that interrupts it."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[bool] = loop.create_future()
        fileno = conn.pgconn.socket
        loop.add_reader(fileno, lambda: woken.done() or woken.set_result(True))
        self._woken = woken
        self._idle_since = loop.time()
        self._resting.set()
        try:
            return await woken
        finally:
            self._idle_total += loop.time() - self._idle_since
            self._idle_since = None
            self._resting.clear()
            self._woken = None
            loop.remove_reader(fileno)

    async def open(self, timeout: float = CLIENT_TIMEOUT_SECONDS) -> None:
        """Connects now, unless connected (StatementTimedOut after `timeout` seconds)."""
        deadline = asyncio.get_running_loop().time() + timeout
        await self._acquire(deadline, timeout)
        try:
            await self._connection(deadline, timeout)
        finally:
            self._lock.release()

    async def _connection(self, deadline: float, timeout: float) -> psycopg.AsyncConnection:
        """The open connection, made first if needed (cancelling a connect is always safe)."""
        if self._conn is None or self._conn.closed:
            try:
                async with asyncio.timeout_at(deadline):
                    self._conn = await connect(self._dsn, self._application_name, self._prepare)
                self.generation += 1
            except TimeoutError:
                raise StatementTimedOut(f"{self._application_name}: could not connect within {timeout:.1f} s") from None
        return self._conn

    async def _run(self, conn: psycopg.AsyncConnection, statement: Statement[P, R], params: P,
                   first: Bound | None) -> list[R]:
        retries = 0
        while True:
            try:
                if first is None:
                    return await run_statement(conn, statement, params)
                return await statements.fetch_after_lock_async(conn, first, statement, params, prepare=None)
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

    def severing(self) -> bool:
        """After `sever()`: whether the statement it made fail has not noticed yet."""
        return statement_under_way(self._conn)

    async def _discard(self) -> None:
        """Drops the connection (closing never waits for the server, which may be what hangs)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except psycopg.Error:
                pass

    async def close(self, timeout: float = CLIENT_TIMEOUT_SECONDS) -> None:
        """Closes the connection once no statement runs on it (a listener waiting idle hands it over)."""
        await self._acquire(asyncio.get_running_loop().time() + timeout, timeout)
        try:
            await self._discard()
        finally:
            self._lock.release()


async def run_statement(conn: psycopg.AsyncConnection, statement: Statement[P, R], params: P) -> list[R]:
    """Runs one statement and returns its rows, or none for a statement run for its effect;
    prepared as the connection's `prepare_threshold` says."""
    if statement.row is None:
        await statements.execute_async(conn, statement, params, prepare=None)
        return []
    return await statements.fetch_async(conn, statement, params, prepare=None)


def statement_under_way(conn: psycopg.AsyncConnection | None) -> bool:
    """Whether psycopg still waits for a statement on `conn`. After `shut_down`, until psycopg has
    noticed: a statement cancelled before that makes psycopg send a cancel request and wait for the
    server to confirm, up to 10 s; once it has noticed, the connection is broken and nothing waits."""
    return (conn is not None and not conn.closed
            and conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.ACTIVE)


def receive_notifications(conn: psycopg.AsyncConnection, on_notify: Callable[[psycopg.Notify], None]) -> None:
    """Reads what the server sent to the idle `conn` and passes on the notifications in it, as
    psycopg's own notifies() does (libpq's consume_input, then its queue of notifications): it
    raises OperationalError when the connection is gone."""
    conn.pgconn.consume_input()
    encoding = conn.info.encoding
    while (note := conn.pgconn.notifies()) is not None:
        on_notify(psycopg.Notify(note.relname.decode(encoding), note.extra.decode(encoding), note.be_pid))


def shut_down(conn: psycopg.AsyncConnection) -> None:
    """Shuts a connection's socket down (without closing the descriptor psycopg waits on): the
    statement waiting on it fails within psycopg's 0.1 s wait interval, and the connection is
    broken, so its owner drops it."""
    if conn.closed:
        return
    try:
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, psycopg.Error):
        pass  # no socket left (the connection was lost meanwhile): the statement is failing anyway

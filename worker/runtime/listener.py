"""LISTEN/NOTIFY wake-ups for idle workers, and cancellations of running tasks; polling where
notifications do not arrive.

Producers send one notification per queue per statement: `queue` when tasks are due now,
`queue <epoch>` when the batch is only due later. The listener turns those into a wake-up
now or a timed wake-up, and asks for one poll, one scheduler pass, one look at the settings and
one at the cron schedules after every (re)connect, since notifications sent while it was not
listening are lost. A cancellation of a running task names the worker that holds it; that worker
looks the task up and stops the handler at once if it was cancelled. A change of a queue's
settings, or of a cron schedule, has the duty that depends on it look again.

Every notification is a hint, never an order: any login may LISTEN and NOTIFY on any channel,
with any payload, so none decides anything by itself. A wake-up costs at most one claim (which
finds nothing if nothing is due), a cancellation one look at the task (queueworker.runtime.cancels),
a settings or schedule notice one look at the settings or schedules; notices that arrive while a
look is already due are that same look. Malformed ones are counted, not logged: a flood of them
must not flood the log either.

The listener listens on the worker's duty connection whenever no heartbeat or housekeeping
statement runs on it (DutyConnection.listen_while_idle): notifications that arrive during a
statement are kept by psycopg and acted on right after it.

Through a PgBouncer in transaction pooling mode a LISTEN stays behind on a server connection the
worker held for that one statement, and no notification ever reaches the worker. So the listener
first checks that a notification it sends itself arrives; when it does not (or with --no-listen)
it polls instead (the check's notification goes out on the outcome connection: on the listening
one, a pooler could run it on the very server connection that LISTENs): every poll interval, the
same look at everything a notification could have announced, and a look at whether a task the
worker runs was cancelled. The cron duty, told that notifications no longer reach it, polls at its
own slower pace (worker/runtime/cron.py).

Only a notice read while the duty connection is idle counts, so a check's time is counted on the
connection's idle clock: a worker kept busy by claims at start (one started against a backlog) goes
on checking, a little more slowly each time, until its connection is idle, instead of being judged
unable to hear after a few seconds of wall time. A check that fails is not final either: one
statement holding the connection past CHECK_MOST_SECONDS (a scheduler pass admitting thousands of
due tasks into a keyed queue can run for seconds) fails it on a direct connection too. So a
polling listener checks again, after RECHECK_FIRST_SECONDS and then twice as long each time up to
RECHECK_MAX_SECONDS, and listens again once a check passes (never with --no-listen).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import psycopg

from ..db import connection as db
from ..db.notify import (CANCEL_CHANNEL, CRON_CHANNEL, LISTEN_CHECK_SECONDS, NOTIFY_CHANNEL, NOTIFY_CHECK, QUEUES_CHANNEL,
                         NotifyCheckParams, check_channel, unlisten_all)
from .. import metrics
from ..events import parse_announcement
from .. import dsn as dsn_text
from .signals import WorkerSignals

log = logging.getLogger("queueworker.listener")

# When a polling listener checks again whether notifications arrive: first after this long, then
# twice as long after each check that fails, at most RECHECK_MAX_SECONDS apart (about 48 checks a
# day once there). Through a pooler each check leaves a LISTEN on some server connection, on a
# channel of its own that only that check notified.
RECHECK_FIRST_SECONDS = 60.0
RECHECK_MAX_SECONDS = 1800.0
# A check's LISTEN_CHECK_SECONDS are counted on the duty connection's idle clock, not the wall's:
# a connection kept busy by claims (a worker started against a backlog, as every replica the
# controller adds for one is) reads its notices with statements' answers, which prove nothing, and
# must not be judged unable to hear. The first check still ends after CHECK_MOST_SECONDS whatever
# the clock says (one statement that holds the connection that long: the worker polls and checks
# again later). A polling listener's check ends after LISTEN_CHECK_SECONDS of wall time: its polls
# wait for it, and failing it only keeps the worker polling.
CHECK_MOST_SECONDS = 60.0
# After a notice that came with a statement's answer the check is sent again, first after this
# long, then twice as long each time, at most CHECK_RESEND_MOST_SECONDS apart: a busy worker sends
# a few a second at first and one a second later, not one per statement it runs. It is sent at once
# when the duty connection has rested CHECK_RESEND_IDLE_SECONDS (idle, no statement in between): a
# worker that ran out of work passes the check within moments, and hears the next announcement
# (until it passes it listens on no queue's channel: a partitioned run's consolidation, enqueued by
# the completion of its last partition, waited for the paced re-send, about 190 ms after a drain).
CHECK_RESEND_FIRST_SECONDS = 0.05
CHECK_RESEND_MOST_SECONDS = 1.0
CHECK_RESEND_IDLE_SECONDS = 0.005

class Listener:
    def __init__(self, dsn: str, conn: db.DutyConnection, send: db.DutyConnection, queues: tuple[str, ...],
                 wake: Callable[[float], None], worker_id: str, on_cancel: Callable[[int, int], bool],
                 on_settings: Callable[[], None], on_schedules: Callable[[], None], catch_up: Callable[[], None],
                 signals: WorkerSignals, listen: bool = True, poll_interval: float = 1.0):
        self._dsn = dsn
        self._conn = conn  # listens while idle
        self._send = send  # sends the check's notification
        self._queues = set(queues)
        self._wake = wake  # called with the epoch time at which work is due (<= now: at once)
        self._worker_id = worker_id
        # Called with the (task id, lease token) a cancellation notice names: whether it has the task
        # looked up (the worker runs that attempt).
        self._on_cancel = on_cancel
        self._on_settings = on_settings  # a queue's flow-control settings changed
        # A cron schedule changed, or changes may have gone unheard (listening again), or will no
        # longer be heard of (polling from now on).
        self._on_schedules = on_schedules
        # Listening (again), or polling: whatever was announced before is lost, so look again at
        # everything a notification could have said (tasks due now or later, settings, running
        # tasks cancelled).
        self._catch_up = catch_up
        self._signals = signals
        self.polling = not listen
        self._poll_interval = poll_interval
        # While polling after a failed check: when to check again (the event loop's clock), and how
        # long the wait after the next failure is. None with --no-listen: never.
        self._recheck_at: float | None = None
        self._recheck_wait = RECHECK_FIRST_SECONDS

    async def step(self) -> float:
        """Listens until the connection is lost or replaced, then returns to listen again at once: a
        listener that has been listening is healthy, and its next connection failure starts a fresh
        ErrorWait. Failing to connect or to LISTEN raises (the supervisor waits and retries).
        Notifications for queues this worker does not work are ignored. Polling instead, one look
        per pass, and when the time has come, the check again (listening from then on if it passes)."""
        loop = asyncio.get_running_loop()
        if self.polling:  # and, when it is time to check again, one last look before the check's wait
            self._catch_up()
            if self._recheck_at is None or loop.time() < self._recheck_at:
                return self._poll_interval
            # The next check's time is set before this one runs: a check that raises (the
            # supervisor then waits and retries) leaves the listener polling until then.
            self._schedule_recheck(loop.time())
        if not await self._notifications_arrive():
            if not self.polling:
                log.warning("notifications do not reach this worker (a PgBouncer in transaction pooling mode?): "
                            "polling every %g s instead of listening, and checking again in %g s",
                            self._poll_interval, self._recheck_wait)
                self.polling = True
                self._on_schedules()
                self._schedule_recheck(loop.time())
            return 0.0
        if self.polling:
            log.info("notifications reach this worker again: listening instead of polling")
            self.polling = False
            self._recheck_at, self._recheck_wait = None, RECHECK_FIRST_SECONDS
        listening = await self._conn.listen((NOTIFY_CHANNEL, CANCEL_CHANNEL, QUEUES_CHANNEL, CRON_CHANNEL))
        self._catch_up()
        self._on_schedules()
        self._signals.listening.emit(None)
        try:
            await self._conn.listen_while_idle(listening, self._heard)
        except psycopg.OperationalError as exc:
            metrics.DB_ERRORS.labels("listen").inc()
            log.warning("listener connection lost, reconnecting: %s", dsn_text.explain(exc, self._dsn))
        return 0.0

    def _schedule_recheck(self, now: float) -> None:
        """The next check after the current wait; each later one waits twice as long, up to the most."""
        self._recheck_at = now + self._recheck_wait
        self._recheck_wait = min(2 * self._recheck_wait, RECHECK_MAX_SECONDS)

    async def _notifications_arrive(self) -> bool:
        """Whether NOTIFYs reach the duty connection (db.notify.notifications_arrive), checked
        without holding it: it listens on a channel of its own, the outcome connection notifies
        that channel, and the duty connection waits for the notice while idle, so claims and
        heartbeats go on meanwhile (through a PgBouncer the notice never comes: the check fails once
        the connection has been idle LISTEN_CHECK_SECONDS in all while a notice was on its way, by
        its idle clock, or after CHECK_MOST_SECONDS; a polling listener's, after LISTEN_CHECK_SECONDS
        of wall time). Only a notice read while the connection is idle counts: through a
        pooler in transaction mode, a statement of ours may run on the very server connection that
        listens and bring its notice back once, which says nothing of the next; such a notice has
        the check sent again, a little later each time. Raises when the connection breaks meanwhile."""
        channel = check_channel()
        news = asyncio.Event()  # the notice came, one way or the other
        arrived = False  # read while idle: proof

        def heard(notify: psycopg.Notify, idle: bool) -> None:
            nonlocal arrived
            if notify.channel == channel:
                arrived = arrived or idle
                news.set()
        generation = await self._conn.listen([channel])
        waiting = asyncio.create_task(self._conn.listen_while_idle(generation, heard))
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + (LISTEN_CHECK_SECONDS if self.polling else CHECK_MOST_SECONDS)
        resend_after, send = CHECK_RESEND_FIRST_SECONDS, True
        # Idle time while a notice was on its way, over the notices sent before this one (not the
        # pauses between them: nothing could arrive then), and the idle clock when this one went.
        idle_before, idle_at_send = 0.0, 0.0
        try:
            while not arrived and not waiting.done():
                if send:
                    news.clear()
                    await self._send.execute(NOTIFY_CHECK, NotifyCheckParams(channel=channel))
                    send, idle_at_send = False, self._conn.idle_seconds()
                idle_left = LISTEN_CHECK_SECONDS - idle_before - (self._conn.idle_seconds() - idle_at_send)
                wall_left = give_up_at - loop.time()
                if idle_left <= 0 or wall_left <= 0:
                    break
                notice = asyncio.create_task(news.wait())
                try:
                    await asyncio.wait((waiting, notice), timeout=min(idle_left, wall_left),
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    notice.cancel()
                    await asyncio.gather(notice, return_exceptions=True)
                if news.is_set() and not arrived and not waiting.done():
                    idle_before += self._conn.idle_seconds() - idle_at_send
                    # It came with a statement's answer: ask again later, or once the connection rests.
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
                    # that comes as the connection rests, and the stopping worker's duty never ended.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(resend_after):
                            await self._conn.idle_for(CHECK_RESEND_IDLE_SECONDS)
                    resend_after, send = min(2 * resend_after, CHECK_RESEND_MOST_SECONDS), True
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        if waiting.done() and not waiting.cancelled() and not arrived:
            waiting.result()  # its error, if the connection broke
            raise psycopg.OperationalError("the duty connection was replaced during the listen check")
        if arrived:
            # Every check channel, this one's and those of checks that failed on this connection
            # while it was kept busy: nothing else listens on it before the check passes.
            await self._conn.using(unlisten_all)
        return arrived

    def _heard(self, notify: psycopg.Notify, idle: bool) -> None:
        """Every notification is a hint (see above), however it came: on a connection of its own,
        one that came with a statement's answer is as good as one read while idle."""
        self._signals.heard.emit(notify)
        metrics.NOTIFICATIONS.labels(notify.channel, self._act_on(notify)).inc()

    def _act_on(self, notify: psycopg.Notify) -> str:
        """Passes a notification on as the hint it is; says what came of it: "acted", "ignored"
        (not for this worker) or "malformed"."""
        if notify.channel == CANCEL_CHANNEL:
            return self._handle_cancel(notify.payload)
        if notify.channel == QUEUES_CHANNEL:
            if notify.payload not in self._queues:
                return "ignored"
            self._on_settings()
        elif notify.channel == CRON_CHANNEL:
            self._on_schedules()  # every worker's duty handles every schedule
        elif notify.channel == NOTIFY_CHANNEL:
            return self._handle(notify.payload)
        else:
            return "ignored"
        return "acted"

    def _handle(self, payload: str) -> str:
        queue = payload.partition(" ")[0]
        if queue not in self._queues:
            return "ignored"
        announced = parse_announcement(payload)
        if announced is None:  # never from queueworker: garbage is counted, and changes nothing
            log.debug("ignoring malformed notification for queue %s", queue)
            return "malformed"
        self._wake(announced[1])
        return "acted"

    def _handle_cancel(self, payload: str) -> str:
        """`worker-id task-id lease-token`: ours only. A cancellation missed while disconnected is
        found by the next heartbeat (the lease is gone)."""
        worker, _, rest = payload.partition(" ")
        if worker != self._worker_id:
            return "ignored"
        try:
            task_id, token = (int(part) for part in rest.split(" "))
        except ValueError:
            log.debug("ignoring malformed cancellation notice")
            return "malformed"
        return "acted" if self._on_cancel(task_id, token) else "ignored"

"""The listener's check that notifications reach the duty connection (worker/runtime/listener.py),
against a duty connection that delivers the check's notice as a pooler would.

Through a PgBouncer in transaction mode the notice never reaches an idle client, but a statement of
the worker's own may run on the very server connection that listens and bring the notice back with
its answer, once. Such a notice proves nothing (the next one may go nowhere): the check sends again
and counts only a notice read while the connection was idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from queueworker.client.producer import enqueue
from queueworker.runtime import listener as listener_module
from queueworker.runtime.listener import Listener
from queueworker.runtime.signals import WorkerSignals
from queueworker.runtime.worker import Worker
from queueworker.settings import WorkerSettings
from tests.support import builtin_registry, until


class PooledDuty:
    """A duty connection whose check notices arrive as `delivered` says: "idle" (a connection of its
    own, while it waits), "answer" (with a statement's answer: a shared server connection), or
    "never"; `sent` counts the checks the outcome connection sent. Its idle clock runs unless it is
    `busy` (statements back to back)."""

    def __init__(self, delivered: str, busy: bool = False):
        self.delivered = delivered
        self.sent = 0
        self.notices = 0  # notices delivered
        self.channel = ""
        self._on_notify: Callable[[psycopg.Notify, bool], None] | None = None
        self.unlistened = False
        self.busy = busy
        self._idle = 0.0
        self._since = time.monotonic()

    def idle_seconds(self) -> float:
        return self._idle + (0.0 if self.busy else time.monotonic() - self._since)

    def set_busy(self, busy: bool) -> None:
        now = time.monotonic()
        if not self.busy:
            self._idle += now - self._since
        self.busy, self._since = busy, now

    async def idle_for(self, seconds: float) -> None:
        while self.busy or time.monotonic() - self._since < seconds:
            await asyncio.sleep(0.001)

    async def listen(self, channels: list[str]) -> int:
        (self.channel,) = channels
        return 1

    async def listen_while_idle(self, generation: int, on_notify: Callable[[psycopg.Notify, bool], None]) -> None:
        self._on_notify = on_notify
        await asyncio.Event().wait()  # until cancelled, as the real one while its connection lasts

    async def using(self, work: Callable[[Any], Any]) -> None:
        self.unlistened = True

    async def execute(self, statement: Any, params: Any) -> None:  # the outcome connection sends the check
        self.sent += 1
        if self.delivered != "never":
            asyncio.get_running_loop().call_later(0.05, self._deliver)

    def _deliver(self) -> None:
        """The notice, a moment after it was sent: through a pooler, with the answer to a statement
        that happened to run on the server connection that listens, after the client had idled."""
        assert self._on_notify is not None
        self.notices += 1
        self._on_notify(psycopg.Notify(self.channel, "", 1), self.delivered == "idle")


def listener_of(duty: PooledDuty) -> Listener:
    return Listener("postgresql://db/app", duty, duty,  # type: ignore[arg-type]
                    ("default",), lambda due: None, "w", lambda task, token: False,
                    lambda: None, lambda: None, lambda: None, WorkerSignals())


def check(duty: PooledDuty) -> bool:
    return asyncio.run(asyncio.wait_for(listener_of(duty)._notifications_arrive(), 10))


@pytest.fixture(autouse=True)
def short_check(monkeypatch):
    monkeypatch.setattr(listener_module, "LISTEN_CHECK_SECONDS", 0.3)


def test_a_notice_read_while_idle_passes_the_check_at_once():
    duty = PooledDuty("idle")
    assert check(duty) is True
    assert duty.sent == 1 and duty.unlistened


@pytest.mark.parametrize("delivered", ["answer", "never"])
def test_a_notice_that_only_comes_with_a_statements_answer_fails_the_check(delivered):
    duty = PooledDuty(delivered)
    assert check(duty) is False
    assert not duty.unlistened
    if delivered == "answer":
        assert duty.sent > 1, "the check was sent again after a notice that proved nothing"
    else:
        assert duty.sent == 1


def test_a_busy_duty_connection_goes_on_checking_until_it_is_idle_not_for_the_checks_seconds_of_wall_time():
    """A worker started against a backlog claims back to back: its duty connection reads each
    notice with a claim's answer. Judged by the wall clock, the check failed after its seconds and
    the worker polled (a warning blaming a PgBouncer, and a minute of polling): on the idle clock it
    goes on, sending again a little later each time (not once per statement), and passes once the
    connection is idle."""
    duty = PooledDuty("answer", busy=True)

    async def scenario() -> bool:
        checking = asyncio.create_task(listener_of(duty)._notifications_arrive())
        started = time.monotonic()
        await until(lambda: time.monotonic() > started + 3 * listener_module.LISTEN_CHECK_SECONDS
                    or checking.done(), message="three times the check's seconds")
        assert not checking.done(), "the check failed while the connection was busy"
        assert 2 <= duty.sent <= 6, f"{duty.sent} checks sent: each one should wait twice as long as the last"
        duty.delivered = "idle"
        duty.set_busy(False)
        return await asyncio.wait_for(checking, 10)

    assert asyncio.run(scenario()) is True
    assert duty.unlistened


def test_a_busy_connection_that_comes_to_rest_is_checked_again_at_once_not_at_the_paced_resend(monkeypatch):
    """A worker that ran out of work passes the check within moments of resting: until it passes it
    listens on no queue's channel, and the paced re-send (up to a second after a drain) kept the
    announcement of the next task (a run's consolidation, enqueued by its last partition's
    completion) unheard until then. With the pacing at an hour, only the rest can send it again."""
    monkeypatch.setattr(listener_module, "CHECK_RESEND_FIRST_SECONDS", 3600.0)
    duty = PooledDuty("answer", busy=True)

    async def scenario() -> bool:
        checking = asyncio.create_task(listener_of(duty)._notifications_arrive())
        await until(lambda: duty.notices == 1, message="the first check's notice, with a statement's answer")
        await asyncio.sleep(0)  # the check's turn to take it in
        assert not checking.done() and duty.sent == 1
        duty.delivered = "idle"
        duty.set_busy(False)
        return await asyncio.wait_for(checking, 10)

    assert asyncio.run(scenario()) is True
    assert duty.sent == 2 and duty.unlistened


class RestingDuty(PooledDuty):
    """A busy duty connection that comes to rest when the test says so (`rest`)."""

    def __init__(self) -> None:
        super().__init__("answer", busy=True)
        self.rest = asyncio.Event()

    async def idle_for(self, seconds: float) -> None:
        await self.rest.wait()


@pytest.mark.parametrize("turns", range(4))
def test_a_check_cancelled_as_its_connection_comes_to_rest_ends(monkeypatch, turns):
    """A worker stopped at the moment its duty connection came to rest: the shutdown cancels the
    listen duty while its check waits for that rest. Python 3.11's asyncio.wait_for returns the
    result it waited for when its task is cancelled as that result arrives, swallowing the
    cancellation: the check went on, the duty never ended, and the worker hung in its shutdown
    until killed. Cancelled a few loop turns after the rest (each interleaving), it ends cancelled."""
    monkeypatch.setattr(listener_module, "CHECK_RESEND_FIRST_SECONDS", 3600.0)
    duty = RestingDuty()

    async def scenario() -> bool:
        checking = asyncio.create_task(listener_of(duty)._notifications_arrive())
        await until(lambda: duty.notices == 1, message="the first check's notice, with a statement's answer")
        for _ in range(3):
            await asyncio.sleep(0)  # the check takes it in and waits for the connection to rest
        assert not checking.done() and duty.sent == 1
        duty.rest.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        checking.cancel()
        done, _ = await asyncio.wait([checking], timeout=5)
        return bool(done) and checking.cancelled()

    assert asyncio.run(scenario()), f"the check went on after its cancellation ({duty.sent} checks sent)"


def test_a_check_ends_after_its_most_seconds_however_busy_the_connection(monkeypatch):
    """One statement holding the connection for good (it never idles, no notice comes): the check
    fails after CHECK_MOST_SECONDS, and the worker polls and checks again later."""
    monkeypatch.setattr(listener_module, "CHECK_MOST_SECONDS", 0.5)
    duty = PooledDuty("never", busy=True)
    assert check(duty) is False
    assert duty.sent == 1 and not duty.unlistened


def test_a_polling_listeners_check_ends_after_the_checks_seconds_of_wall_time():
    """A recheck while polling pauses the polls: on a busy connection it ends after
    LISTEN_CHECK_SECONDS of wall time (failing it only keeps the worker polling), not after
    CHECK_MOST_SECONDS."""
    duty = PooledDuty("never", busy=True)
    listener = listener_of(duty)
    listener.polling = True
    started = time.monotonic()
    assert asyncio.run(asyncio.wait_for(listener._notifications_arrive(), 10)) is False
    assert time.monotonic() - started < listener_module.CHECK_MOST_SECONDS / 2
    assert duty.sent == 1


@pytest.mark.integration
@pytest.mark.parametrize("past", ["its idle seconds", "its most seconds"])
def test_a_duty_connection_kept_busy_through_the_check_ends_up_listening(dsn, monkeypatch, caplog, past):
    """On a direct connection, the duty connection is busy from the check's LISTEN on (a statement
    waiting for a lock; in production, claims back to back against a backlog, or back-to-back
    scheduler passes admitting thousands of due tasks into a keyed queue at start-up, which took
    7.5 s each). Past the check's seconds of wall time (which the idle clock does not count), the
    check goes on and passes once the connection is free: the worker never polls. Past its most
    seconds, the check fails and the worker polls; once the connection is free, the next check
    passes and the worker listens again. Either way a task enqueued then wakes it by notification."""
    monkeypatch.setattr(listener_module, "RECHECK_FIRST_SECONDS", 0.5)
    # The notice of a check sent while the lock holds comes with the statement's answer: an hour's
    # pacing leaves the check to be sent again once the connection rests.
    monkeypatch.setattr(listener_module, "CHECK_RESEND_FIRST_SECONDS", 3600.0)
    if past == "its most seconds":
        monkeypatch.setattr(listener_module, "CHECK_MOST_SECONDS", 0.5)
    caplog.set_level(logging.INFO, logger="queueworker.listener")

    async def drive(listener: Listener) -> None:
        """The listener's supervisor, without its waits between polls."""
        while True:
            await asyncio.sleep(min(await listener.step(), 0.05))

    async def scenario() -> None:
        worker = Worker(dsn, WorkerSettings(), builtin_registry())
        holder = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        await holder.execute("SELECT pg_advisory_lock(4242)")
        busy: list[asyncio.Task] = []
        listen = worker._duty_conn.listen

        async def listen_then_busy(channels: list[str]) -> int:
            """The check's LISTEN, then (the first time) a statement that waits for the test's lock."""
            generation = await listen(channels)
            if not busy:
                busy.append(asyncio.create_task(worker._duty_conn.using(
                    lambda conn: conn.execute("SELECT pg_advisory_lock(4242)"))))
            return generation
        monkeypatch.setattr(worker._duty_conn, "listen", listen_then_busy)
        driver: asyncio.Task | None = None
        try:
            listening = worker.signals.listening.expect()
            driver = asyncio.create_task(drive(worker.listener))
            if past == "its most seconds":
                await until(lambda: worker.listener.polling or driver.done(), message="the check to fail")
            else:  # the wall-clock check failed after LISTEN_CHECK_SECONDS
                started = time.monotonic()
                await until(lambda: time.monotonic() > started + 3 * listener_module.LISTEN_CHECK_SECONDS
                            or worker.listener.polling or driver.done(), message="three times the check's seconds")
                assert not worker.listener.polling, "a check failed while the connection was busy"
            assert busy and not busy[0].done(), "the duty connection was busy through the whole check"
            await holder.execute("SELECT pg_advisory_unlock(4242)")
            await busy[0]
            await asyncio.wait_for(listening, 30)
            assert not worker.listener.polling

            async def channels(conn: psycopg.AsyncConnection) -> list[str]:
                return [row[0] for row in await (await conn.execute("SELECT pg_listening_channels()")).fetchall()]
            listened = await worker._duty_conn.using(channels)
            assert "queueworker" in listened, listened
            assert not [channel for channel in listened if channel.startswith("queueworker_check_")], \
                "the failed check's channel is still listened to"
            woken = worker.signals.woken.expect()
            with psycopg.connect(dsn, autocommit=True) as conn:
                enqueue(conn, "qw.noop")
            await asyncio.wait_for(woken, 30)
        finally:
            if driver is not None:
                driver.cancel()
                await asyncio.gather(driver, return_exceptions=True)
            await holder.close()
            for conn in worker._connections():
                await conn.close()

    asyncio.run(scenario())
    messages = [record.getMessage() for record in caplog.records]
    failed = past == "its most seconds"
    assert any("notifications do not reach this worker" in message for message in messages) == failed, messages
    assert any("notifications reach this worker again" in message for message in messages) == failed, messages

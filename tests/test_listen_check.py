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
    "never"; `sent` counts the checks the outcome connection sent."""

    def __init__(self, delivered: str):
        self.delivered = delivered
        self.sent = 0
        self.channel = ""
        self._on_notify: Callable[[psycopg.Notify, bool], None] | None = None
        self.unlistened = False

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
            await asyncio.sleep(0.01)
            assert self._on_notify is not None
            self._on_notify(psycopg.Notify(self.channel, "", 1), self.delivered == "idle")


def check(duty: PooledDuty) -> bool:
    listener = Listener("postgresql://db/app", duty, duty,  # type: ignore[arg-type]
                        ("default",), lambda due: None, "w", lambda task, token: False,
                        lambda: None, lambda: None, lambda: None, WorkerSignals())
    return asyncio.run(asyncio.wait_for(listener._notifications_arrive(), 10))


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


@pytest.mark.integration
def test_a_check_failed_by_a_busy_duty_connection_is_made_again_and_the_worker_listens(dsn, monkeypatch, caplog):
    """On a direct connection, the duty connection is busy from the check's LISTEN to its end (a
    statement waiting for a lock; in production, back-to-back scheduler passes admitting thousands
    of due tasks into a keyed queue at start-up, which took 7.5 s each): the check fails and the
    worker polls. Once the connection is free, the next check passes and the worker listens again,
    and a task enqueued then wakes it by notification."""
    monkeypatch.setattr(listener_module, "RECHECK_FIRST_SECONDS", 0.5)
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
            await until(lambda: worker.listener.polling or driver.done(), message="the check to fail")
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
    assert any("notifications do not reach this worker" in message for message in messages), messages
    assert any("notifications reach this worker again" in message for message in messages), messages

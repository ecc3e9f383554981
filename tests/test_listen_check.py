"""The listener's check that notifications reach the duty connection (worker/runtime/listener.py),
against a duty connection that delivers the check's notice as a pooler would.

Through a PgBouncer in transaction mode the notice never reaches an idle client, but a statement of
the worker's own may run on the very server connection that listens and bring the notice back with
its answer, once. Such a notice proves nothing (the next one may go nowhere): the check sends again
and counts only a notice read while the connection was idle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from queueworker.runtime import listener as listener_module
from queueworker.runtime.listener import Listener
from queueworker.runtime.signals import WorkerSignals


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

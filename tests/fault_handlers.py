"""Handlers for the fault-injection tests: handlers that misbehave on purpose, and a probe that
records when it starts and when it is cancelled."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from queueworker import task


def _note(path: str, event: str) -> None:
    with Path(path).open("a") as log:
        log.write(f"{event} {os.getpid()} {time.time():.3f}\n")


@task(name="probe.sleep")
async def probe_sleep(payload: dict) -> None:
    """Sleeps, noting its start and its cancellation (with this worker's pid and the time)."""
    _note(payload["log"], "start")
    try:
        await asyncio.sleep(payload["seconds"])
    except asyncio.CancelledError:
        _note(payload["log"], "cancelled")
        raise
    _note(payload["log"], "finished")


@task(name="block.loop")
async def block_loop(payload: dict) -> str:
    """An async handler doing blocking work: freezes its worker's event loop."""
    time.sleep(payload["seconds"])
    return "blocked"


@task(name="stuck.sync")
def stuck_sync(payload: dict) -> None:
    """A sync handler that ignores ctx.cancelled and outlives its deadline."""
    threading.Event().wait(payload["seconds"])


@task(name="quick.sync")
def quick_sync(payload: dict) -> str:
    time.sleep(payload["seconds"])
    return "done"


@task(name="stubborn.async")
async def stubborn_async(payload: dict) -> None:
    """An async handler that catches every cancellation and goes on: its deadline's, the drain's."""
    _note(payload["log"], "start")
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _note(payload["log"], "ignored a cancellation")

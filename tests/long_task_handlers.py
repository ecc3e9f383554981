"""Handlers for the long-task tests: checkpoints, pages, snoozes, Retry-After, and handlers that run until told."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from queueworker import Continue, RetryAfter, Snooze, task


@task(name="long.count")
def count(payload, ctx):
    """Counts to `to`, a step every `step_seconds`, saving a checkpoint and reporting progress after
    each step; resumes from the checkpoint an earlier attempt saved."""
    start = ctx.checkpoint["next"] if ctx.checkpoint else 0
    for step in range(start, payload["to"]):
        if ctx.cancelled.is_set():
            return None  # drained or lease lost: the next attempt resumes from the checkpoint
        time.sleep(payload["step_seconds"])
        ctx.progress(step + 1, payload["to"], f"step {step + 1}")
        if not ctx.save_checkpoint({"next": step + 1, "first_attempt_start": start}):
            return None
    return {"resumed_from": start, "attempt": ctx.attempt}


@task(name="long.page")
def page(payload, ctx):
    """One page of a paged export: the next page follows in the same statement as this one's success."""
    time.sleep(payload.get("sleep", 0))
    if payload["page"] + 1 < payload["pages"]:
        return Continue({**payload, "page": payload["page"] + 1}, result={"page": payload["page"]})
    return {"page": payload["page"], "last": True}


@task(name="long.wait_until")
def wait_until(payload, ctx):
    """Snoozes until `until` (epoch seconds): not there yet is not a failure."""
    left = payload["until"] - time.time()
    if left > 0:
        raise Snooze(left)
    return {"attempt": ctx.attempt}


@task(name="long.rate_limited")
async def rate_limited(payload, ctx):
    """A partner that answers 429 with Retry-After on the first attempt."""
    if ctx.attempt == 1:
        raise RetryAfter(payload["retry_after"], "429 Too Many Requests")
    return {"attempt": ctx.attempt}


@task(name="long.async_checkpoint")
async def async_checkpoint(payload, ctx):
    """An async handler saves a checkpoint by awaiting save_checkpoint."""
    ctx.progress(1, 2, "half")
    saved = await ctx.save_checkpoint({"half": True})
    return {"saved": saved, "checkpoint": ctx.checkpoint}


def _report(path: str, ctx) -> None:
    Path(path).write_text(json.dumps({"reason": ctx.cancel_reason, "at": time.time()}))


@task(name="long.until_cancelled")
def until_cancelled(payload, ctx):
    """Waits to be told to stop, then writes down why and when."""
    ctx.cancelled.wait(payload.get("timeout", 60))
    _report(payload["report"], ctx)


@task(name="long.async_until_cancelled")
async def async_until_cancelled(payload, ctx):
    """Sleeps until the worker cancels it, then writes down why and when."""
    try:
        await asyncio.sleep(payload.get("timeout", 60))
    except asyncio.CancelledError:
        _report(payload["report"], ctx)
        raise


@task(name="long.until_released")
def until_released(payload, ctx):
    """Runs until the file `release` exists, then succeeds; stopped before, writes down why and when."""
    release = Path(payload["release"])
    while not release.exists():
        if ctx.cancelled.wait(0.05):
            _report(payload["report"], ctx)
            return None
    return {"attempt": ctx.attempt}

"""Handlers for the flow-control tests."""

from __future__ import annotations

import time
from pathlib import Path

from queueworker import task


@task(name="flow.source")
def source(payload, ctx):
    """A scrape source that is down while its marker file exists."""
    if Path(payload["down_marker"]).exists():
        raise ConnectionError("source unreachable")
    return {"ok": True}


@task(name="flow.hold")
def hold(payload, ctx):
    """Holds its slot for a while, and logs when it started and ended to a file all workers share
    (one short append each: whole lines, in the order they happened on this machine's clock)."""
    log = Path(payload["log"])
    with log.open("a") as out:
        out.write(f"{time.time()!r} 1\n")
    time.sleep(payload["seconds"])
    with log.open("a") as out:
        out.write(f"{time.time()!r} -1\n")


@task(name="flow.keyed_hold")
def keyed_hold(payload, ctx):
    """`flow.hold` for keyed tasks: each line also names the task and its key ('-' for none), so the
    tests can count, per key, the handlers that ran at once."""
    log = Path(payload["log"])
    with log.open("a") as out:
        out.write(f"{time.time()!r} 1 {ctx.task_id} {ctx.key or '-'}\n")
    time.sleep(payload["seconds"])
    with log.open("a") as out:
        out.write(f"{time.time()!r} -1 {ctx.task_id} {ctx.key or '-'}\n")


@task(name="flow.flaky_source")
def flaky_source(payload, ctx):
    """A scrape source per key: hangs (a probe a worker is killed in) while its hang marker exists,
    after saying so in a file; is down while its down marker exists."""
    if payload.get("hang_marker") and Path(payload["hang_marker"]).exists():
        Path(payload["hang_marker"] + ".started").touch()
        time.sleep(600)
    if Path(payload["down_marker"]).exists():
        raise ConnectionError("source unreachable")
    return {"ok": True}

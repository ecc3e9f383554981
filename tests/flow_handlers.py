"""Handlers for the flow-control tests."""

from __future__ import annotations

from pathlib import Path

from queueworker import task


@task(name="flow.source")
def source(payload, ctx):
    """A scrape source that is down while its marker file exists."""
    if Path(payload["down_marker"]).exists():
        raise ConnectionError("source unreachable")
    return {"ok": True}

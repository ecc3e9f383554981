"""What `queueworker status` shows, and the console with it: counts per queue and state, the oldest
ready task's age, flow control, live workers, and running tasks whose lease expired. The CLI renders
it as text (queueworker.cli.tables), or prints it as JSON.
"""

from __future__ import annotations

from typing import Any

import psycopg

from .. import jsonvalue
from ..db import statements
from ..db.flow import KeyRow, QueueRow
from ..db.inspect import (
    LIVE_WORKERS, OLDEST_PENDING_AGE, STATUS_COUNTS, STUCK_TASKS, LiveWorkerRow, QueueFilterParams)
from .operations import queue_settings

STATES = ("blocked", "pending", "running", "retrying", "succeeded", "failed", "cancelled")


def collect(conn: psycopg.Connection, queue: str | None = None, stuck: bool = False) -> dict[str, Any]:
    """Everything `status` shows, of every queue or of one (and the workers that work it), as JSON
    values; with `stuck`, also the running tasks whose lease expired and that nobody rescued yet."""
    params = QueueFilterParams(queue=queue)
    queues: dict[str, dict[str, Any]] = {}
    for count in statements.fetch(conn, STATUS_COUNTS, params):
        queues.setdefault(count.queue, {s: 0 for s in STATES})[count.state] = count.n
    for oldest in statements.fetch(conn, OLDEST_PENDING_AGE, params):
        queues.setdefault(oldest.queue, {s: 0 for s in STATES})["oldest_pending_age_seconds"] = round(oldest.age, 3)
    workers = [row._asdict() for row in live_workers(conn, queue)]
    flow = {row.name: flow_control(row) for row in queue_settings(conn, queue) if row.limited}
    report = {"queues": queues, "flow_control": flow, "workers": workers}
    if stuck:
        report["stuck"] = [row._asdict() for row in statements.fetch(conn, STUCK_TASKS, params)]
    return report


def live_workers(conn: psycopg.Connection, queue: str | None = None) -> list[LiveWorkerRow]:
    """The registered workers, the longest running first: all, or those working `queue`."""
    return statements.fetch(conn, LIVE_WORKERS, QueueFilterParams(queue=queue))


def describe_progress(progress_json: str | None) -> str:
    """`done/total message`, from the JSON a handler reported (shown as stored if it is odd)."""
    if progress_json is None:
        return ""
    try:
        progress = jsonvalue.decode(progress_json)
        done, total, message = progress["done"], progress.get("total"), progress.get("message")
        return f"{done:g}" + (f"/{total:g}" if total is not None else "") + (f" {message}" if message else "")
    except (ValueError, TypeError, KeyError, AttributeError):  # written by hand, not by ctx.progress
        return progress_json[:80]


def flow_control(row: QueueRow) -> dict[str, Any]:
    """A queue's settings as status shows them (JSON and text alike)."""
    return {"paused": row.paused,
            "paused_until": row.paused_until.isoformat() if row.paused and row.paused_until else None,
            "rate_per_second": row.rate_per_second, "burst": row.burst, "max_running": row.max_running,
            "breaker": None if row.breaker_failures is None else {
                "state": row.breaker_state, "failures": row.breaker_failures,
                "cooldown_seconds": row.breaker_cooldown_seconds, "consecutive_failures": row.consecutive_failures},
            "per_key": None if row.key_rate_per_second is None and row.key_max_running is None else {
                "rate_per_second": row.key_rate_per_second, "burst": row.key_burst,
                "max_running": row.key_max_running},
            "key_breaker": None if row.key_breaker_failures is None else {
                "failures": row.key_breaker_failures, "cooldown_seconds": row.key_breaker_cooldown_seconds},
            "key_limited": row.key_limited}


def describe_flow(flow: dict[str, Any]) -> str:
    """A queue's flow control in a few words (`paused; rate 5/s (burst 5)`), as `status` and the
    console show it."""
    parts = []
    if flow["paused"]:
        parts.append(f"paused until {flow['paused_until']}" if flow["paused_until"] else "paused")
    if flow["rate_per_second"] is not None:
        parts.append(f"rate {flow['rate_per_second']:g}/s (burst {flow['burst']})")
    if flow["max_running"] is not None:
        parts.append(f"at most {flow['max_running']} running")
    if flow["breaker"]:
        breaker = flow["breaker"]
        parts.append(f"breaker {breaker['state']} ({breaker['consecutive_failures']}/{breaker['failures']} "
                     f"failures, cooldown {breaker['cooldown_seconds']:g}s)")
    if flow.get("per_key"):
        parts.append("per key: " + _describe_bucket_and_cap(flow["per_key"]["rate_per_second"],
                                                            flow["per_key"]["burst"], flow["per_key"]["max_running"]))
    elif flow.get("key_limited") and not flow.get("key_breaker"):
        parts.append("some keys limited or paused")
    if flow.get("key_breaker"):
        breaker = flow["key_breaker"]
        parts.append(f"breaker per key ({breaker['failures']} failures, cooldown {breaker['cooldown_seconds']:g}s)")
    return "; ".join(parts) or "no limits"


def describe_key(row: KeyRow) -> str:
    """A key's own settings in a few words (`paused; rate 2/s (burst 2); weight 3`)."""
    parts = []
    if row.paused:
        parts.append(f"paused until {row.paused_until.isoformat()}" if row.paused_until else "paused")
    if row.rate_per_second is not None or row.max_running is not None:
        parts.append(_describe_bucket_and_cap(row.rate_per_second, row.burst, row.max_running))
    if row.weight is not None:
        parts.append(f"weight {row.weight:g} (claims per turn)")
    return "; ".join(parts) or "the queue's per-key defaults"


def _describe_bucket_and_cap(rate: float | None, burst: int | None, max_running: int | None) -> str:
    parts = []
    if rate is not None:
        parts.append(f"rate {rate:g}/s (burst {burst})")
    if max_running is not None:
        parts.append(f"at most {max_running} running")
    return ", ".join(parts)

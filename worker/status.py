"""`queueworker status`: counts per queue and state, oldest pending age, flow control, live workers."""

from __future__ import annotations

from typing import Any

import psycopg

from . import jsonvalue, sql
from .db import typed_rows
from .operations import queue_settings

STATES = ("blocked", "pending", "running", "retrying", "succeeded", "failed", "cancelled")


def collect(conn: psycopg.Connection, queue: str | None = None, stuck: bool = False) -> dict[str, Any]:
    params = {"queue": queue}
    queues: dict[str, dict[str, Any]] = {}
    for name, state, count in conn.execute(sql.STATUS_COUNTS, params):
        queues.setdefault(name, {s: 0 for s in STATES})[state] = count
    for name, age in conn.execute(sql.OLDEST_PENDING_AGE, params):
        queues.setdefault(name, {s: 0 for s in STATES})["oldest_pending_age_seconds"] = round(age, 3)
    columns = ("id", "hostname", "pod_name", "pod_namespace", "pid", "queues", "concurrency", "running",
               "draining", "heartbeat_age_seconds", "started_at")
    workers = [dict(zip(columns, row)) for row in conn.execute(sql.LIVE_WORKERS, params)]
    flow = {row.name: flow_control(row) for row in queue_settings(conn, queue) if row.limited}
    report = {"queues": queues, "flow_control": flow, "workers": workers}
    if stuck:
        with conn.cursor(row_factory=typed_rows(sql.StuckTaskRow)) as cursor:
            report["stuck"] = [row._asdict() for row in cursor.execute(sql.STUCK_TASKS, params)]
    return report


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


def flow_control(row: sql.QueueRow) -> dict[str, Any]:
    """A queue's settings as status shows them (JSON and text alike)."""
    return {"paused": row.paused,
            "paused_until": row.paused_until.isoformat() if row.paused and row.paused_until else None,
            "rate_per_second": row.rate_per_second, "burst": row.burst, "max_running": row.max_running,
            "breaker": None if row.breaker_failures is None else {
                "state": row.breaker_state, "failures": row.breaker_failures,
                "cooldown_seconds": row.breaker_cooldown_seconds, "consecutive_failures": row.consecutive_failures}}


def describe_flow(flow: dict[str, Any]) -> str:
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
    return "; ".join(parts) or "no limits"


def render(report: dict[str, Any]) -> str:
    lines = [f"{'QUEUE':<20} " + " ".join(f"{s.upper():>10}" for s in STATES) + f" {'OLDEST PENDING':>15}"]
    for name, counts in sorted(report["queues"].items()):
        age = counts.get("oldest_pending_age_seconds")
        lines.append(f"{name:<20} " + " ".join(f"{counts[s]:>10}" for s in STATES)
                     + f" {(f'{age:.1f}s' if age is not None else '-'):>15}")
    if not report["queues"]:
        lines.append("(no tasks)")
    if report["flow_control"]:
        lines.append("")
        lines.append(f"{'QUEUE':<20} FLOW CONTROL")
        for name, flow in sorted(report["flow_control"].items()):
            lines.append(f"{name:<20} {describe_flow(flow)}")
    lines.append("")
    lines.append(f"{'WORKER':<38} {'POD':<30} {'RUNNING':>9} {'DRAINING':>9} {'HEARTBEAT':>10}")
    for w in report["workers"]:
        pod = w["pod_name"] or w["hostname"]
        lines.append(f"{w['id']:<38} {pod:<30} {w['running']:>4}/{w['concurrency']:<4} "
                     f"{'yes' if w['draining'] else 'no':>9} {w['heartbeat_age_seconds']:>9.1f}s")
    if not report["workers"]:
        lines.append("(no live workers)")
    if "stuck" in report:
        lines.append("")
        lines.append(f"{'STUCK TASK':>10} {'QUEUE':<20} {'TASK':<24} {'LEASE EXPIRED':>14}  WORKER")
        for task in report["stuck"]:
            lines.append(f"{task['id']:>10} {task['queue'][:20]:<20} {task['task'][:24]:<24} "
                         f"{task['expired_for']:>12.1f}s  {task['lease_owner']}")
        if not report["stuck"]:
            lines.append("(no running task has an expired lease)")
    return "\n".join(lines)

"""`queueworker status`: counts per queue and state, oldest pending age, live workers."""

from __future__ import annotations

from typing import Any

import psycopg

from . import sql

STATES = ("blocked", "pending", "running", "retrying", "succeeded", "failed", "cancelled")


def collect(conn: psycopg.Connection, queue: str | None = None) -> dict[str, Any]:
    params = {"queue": queue}
    queues: dict[str, dict[str, Any]] = {}
    for name, state, count in conn.execute(sql.STATUS_COUNTS, params):
        queues.setdefault(name, {s: 0 for s in STATES})[state] = count
    for name, age in conn.execute(sql.OLDEST_PENDING_AGE, params):
        queues.setdefault(name, {s: 0 for s in STATES})["oldest_pending_age_seconds"] = round(age, 3)
    columns = ("id", "hostname", "pod_name", "pod_namespace", "pid", "queues", "concurrency", "running",
               "draining", "heartbeat_age_seconds", "started_at")
    workers = [dict(zip(columns, row)) for row in conn.execute(sql.LIVE_WORKERS, params)]
    return {"queues": queues, "workers": workers}


def render(report: dict[str, Any]) -> str:
    lines = [f"{'QUEUE':<20} " + " ".join(f"{s.upper():>10}" for s in STATES) + f" {'OLDEST PENDING':>15}"]
    for name, counts in sorted(report["queues"].items()):
        age = counts.get("oldest_pending_age_seconds")
        lines.append(f"{name:<20} " + " ".join(f"{counts[s]:>10}" for s in STATES)
                     + f" {(f'{age:.1f}s' if age is not None else '-'):>15}")
    if not report["queues"]:
        lines.append("(no tasks)")
    lines.append("")
    lines.append(f"{'WORKER':<38} {'POD':<30} {'RUNNING':>9} {'DRAINING':>9} {'HEARTBEAT':>10}")
    for w in report["workers"]:
        pod = w["pod_name"] or w["hostname"]
        lines.append(f"{w['id']:<38} {pod:<30} {w['running']:>4}/{w['concurrency']:<4} "
                     f"{'yes' if w['draining'] else 'no':>9} {w['heartbeat_age_seconds']:>9.1f}s")
    if not report["workers"]:
        lines.append("(no live workers)")
    return "\n".join(lines)

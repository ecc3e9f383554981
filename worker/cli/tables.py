"""Tables for a terminal: what `queueworker status`, `list` and `cron list` print.

The text fits an 80-column terminal: columns are as wide as their contents, a column of zeros that
only some setups use (blocked) is left out, and the one free-text column of a table (a pod, a task
name) is cut to what is left; `--json` has everything, uncut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..client.status import STATES, describe_flow

TERMINAL_WIDTH = 80
COLUMN_GAP = "  "
# States always shown in the text table; the others only when a queue has such tasks.
USUAL_STATES = ("pending", "running", "retrying", "succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False     # numbers line up on the right
    flexible: bool = False  # the column cut to make the table fit


def table(columns: Sequence[Column], rows: Sequence[Sequence[Any]], width: int = TERMINAL_WIDTH) -> list[str]:
    """Rows under their headers, each column as wide as its widest cell; the flexible columns give
    up what the line needs to fit `width`, the widest first (never below their headers)."""
    cells = [[str(value) for value in row] for row in rows]
    widths = [max([len(column.header)] + [len(row[i]) for row in cells]) for i, column in enumerate(columns)]
    excess = sum(widths) + len(COLUMN_GAP) * (len(columns) - 1) - width
    flexible = [i for i, column in enumerate(columns) if column.flexible]
    while excess > 0 and flexible:  # one character at a time from the widest flexible column
        widest = max(flexible, key=lambda i: widths[i] - len(columns[i].header))
        if widths[widest] <= len(columns[widest].header):
            break
        widths[widest] -= 1
        excess -= 1

    def line(values: Sequence[str]) -> str:
        fitted = [_fit(value, widths[i], column.right) for i, (value, column) in enumerate(zip(values, columns))]
        return COLUMN_GAP.join(fitted).rstrip()

    return [line([column.header for column in columns])] + [line(row) for row in cells]


def terminal_text(value: str) -> str:
    """User text (a task key) as one line a terminal shows as it is: every character that is not
    printable (a control character, a line separator, one written by SQL past the API's check)
    escaped as Python writes it (\\x1b, \\u2028)."""
    return value if value.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def _fit(value: str, width: int, right: bool) -> str:
    if len(value) > width:
        value = value[:width - 1] + "…"
    return value.rjust(width) if right else value.ljust(width)


def worker_location(worker: dict[str, Any]) -> str:
    """Where a worker runs: its pod (namespace/name) in Kubernetes, else host and process id."""
    if worker["pod_name"]:
        return f"{worker['pod_namespace']}/{worker['pod_name']}" if worker["pod_namespace"] else worker["pod_name"]
    return f"{worker['hostname']} pid {worker['pid']}"


def render_status(report: dict[str, Any]) -> str:
    """A `status` report (queueworker.client.status.collect) as text."""
    queues = sorted(report["queues"].items())
    states = [state for state in STATES if state in USUAL_STATES or any(counts[state] for _, counts in queues)]
    lines = table([Column("QUEUE", flexible=True), *(Column(state.upper(), right=True) for state in states),
                   Column("OLDEST", right=True)],
                  [[name, *(counts[state] for state in states), age_text(counts.get("oldest_pending_age_seconds"))]
                   for name, counts in queues]) if queues else ["(no tasks)"]
    if report["flow_control"]:
        lines.append("")
        lines += table([Column("QUEUE"), Column("FLOW CONTROL", flexible=True)],
                       [[name, describe_flow(flow)] for name, flow in sorted(report["flow_control"].items())])
    lines.append("")
    if report["workers"]:
        lines += table([Column("WORKER"), Column("WHERE", flexible=True), Column("RUNNING", right=True),
                        Column("DRAINING"), Column("HEARTBEAT", right=True)],
                       [[w["id"][:8], worker_location(w), f"{w['running']}/{w['concurrency']}",
                         "yes" if w["draining"] else "no", age_text(w["heartbeat_age_seconds"])]
                        for w in report["workers"]])
    else:
        lines.append("(no live workers)")
    if "stuck" in report:
        lines.append("")
        if report["stuck"]:
            lines += table([Column("STUCK TASK", right=True), Column("QUEUE"), Column("TASK", flexible=True),
                            Column("EXPIRED FOR", right=True), Column("WORKER")],
                           [[task["id"], task["queue"], task["task"], age_text(task["expired_for"]),
                             str(task["lease_owner"])[:8]] for task in report["stuck"]])
        else:
            lines.append("(no running task has an expired lease)")
    return "\n".join(lines)


def age_text(seconds: float | None) -> str:
    """1.5s, 4m05s, 3h20m, 2d04h: short enough for a column, exact enough to act on."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"

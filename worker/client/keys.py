"""What `queueworker keys` and the console's keys page show: the keys of one queue (docs/flow-control.md),
each with its tasks ready, due later, blocked and running, since when its oldest ready task has been
due, its weight, the limits that hold for it, its pause and its bucket's tokens, its breaker and its
health (failures since its last success, its last success and failure); the keys with the most tasks
ready first, and the totals over every key."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import psycopg
from pydantic import TypeAdapter

from ..db import statements
from ..db.keys import KEY_REPORT, KeyReportParams
from ..names import QueueName

# How many keys one report lists at most: a queue may have hundreds of thousands; the totals count them all.
MAX_KEYS_LISTED = 10_000
DEFAULT_KEYS_LISTED = 50
_QUEUE_NAME = TypeAdapter(QueueName)


def key_report(conn: psycopg.Connection, queue: str, limit: int = DEFAULT_KEYS_LISTED) -> dict[str, Any]:
    """The keys of `queue` as JSON values: `keys` (at most `limit`, the most tasks ready first; `key`
    None is the tasks without a key) and the totals over every key (`keys_total`, `ready_total`,
    `running_total`). The queue name is checked as TaskSpec checks it (pydantic's ValidationError)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_KEYS_LISTED:
        raise ValueError(f"the limit is 1 to {MAX_KEYS_LISTED:,} keys")
    queue = _QUEUE_NAME.validate_python(queue)
    rows = statements.fetch(conn, KEY_REPORT, KeyReportParams(queue=queue, limit=limit))
    now = datetime.now(timezone.utc)

    def since(at: datetime | None) -> float | None:
        return None if at is None else round(max(0.0, (now - at).total_seconds()), 3)

    keys = [{"key": row.key, "ready": row.ready, "later": row.later, "blocked": row.blocked, "running": row.running,
             "oldest_ready_seconds": since(row.ready_since),
             "weight": row.weight, "max_running": row.max_running, "rate_per_second": row.rate_per_second,
             "burst": row.burst, "tokens": row.tokens, "paused": row.paused,
             "paused_until": None if row.paused_until is None else row.paused_until.isoformat(),
             "breaker_state": row.breaker_state, "failure_streak": row.failure_streak,
             "last_success_at": None if row.last_success_at is None else row.last_success_at.isoformat(),
             "last_success_seconds": since(row.last_success_at),
             "last_failure_at": None if row.last_failure_at is None else row.last_failure_at.isoformat(),
             "last_failure_seconds": since(row.last_failure_at)} for row in rows]
    first = rows[0] if rows else None
    return {"queue": queue, "keys": keys,
            "keys_total": first.keys_total if first else 0,
            "ready_total": first.ready_total if first else 0,
            "running_total": first.running_total if first else 0}


def describe_limits(key: dict[str, Any]) -> str:
    """What holds a key of a report back, in a few words (`paused; cap 2; 8/s, 3 of 8 tokens`), as
    `queueworker keys` and the console show it; empty when nothing does."""
    parts = []
    if key["paused"]:
        parts.append(f"paused until {key['paused_until']}" if key["paused_until"] else "paused")
    if key["max_running"] is not None:
        parts.append(f"cap {key['max_running']}")
    if key["rate_per_second"] is not None:
        parts.append(f"{key['rate_per_second']:g}/s, {key['tokens']} of {key['burst']} tokens")
    if key.get("breaker_state") not in (None, "closed"):
        parts.append("breaker " + key["breaker_state"].replace("_", "-"))
    return "; ".join(parts)


def has_health(report: dict[str, Any]) -> bool:
    """Whether a listed key has health to show (the workers report it for key-limited queues)."""
    return any(key["last_success_at"] or key["last_failure_at"] for key in report["keys"])

"""What operators and applications do to tasks that exist: cancel them.

Each call runs in the caller's transaction (inside a savepoint when one is open), like `enqueue`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import psycopg

from . import jsonvalue, sql
from .db import met_moved_row, typed_rows

CANCELLABLE = ("pending", "retrying", "running", "blocked")
REASON_LIMIT = 500
# A row moved between partitions by a commit meanwhile makes Postgres fail the statement (40001);
# it is simply run again with a fresh snapshot, this many times at most.
MOVED_ROW_ATTEMPTS = 5


def cancel(conn: psycopg.Connection, task_id: int, *, reason: str = "cancelled") -> bool:
    """Cancels one unfinished task; True if it was cancelled, False if it had already finished
    (or does not exist). A running task's worker is told at once: its handler sees `ctx.cancelled`
    set and `ctx.cancel_reason == "cancelled"` (an async handler is cancelled), and its slot frees."""
    return bool(cancel_many(conn, ids=[task_id], reason=reason))


def cancel_many(conn: psycopg.Connection, *, ids: Iterable[int] | None = None, queue: str | None = None,
                states: Sequence[str] = CANCELLABLE, reason: str = "cancelled") -> list[sql.CancelledRow]:
    """Cancels the tasks given by id, or every task of `queue`, that are in one of `states`;
    returns one row per task cancelled (its id and the state it was in)."""
    if (ids is None) == (queue is None):
        raise ValueError("give ids or a queue, not both and not neither")
    id_list = None if ids is None else [_task_id(task_id) for task_id in ids]
    unknown = sorted(set(states) - set(CANCELLABLE))
    if unknown or not states:
        raise ValueError(f"states must be some of {', '.join(CANCELLABLE)}; not {', '.join(unknown) or 'none'}")
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("the reason must be a non-empty string")
    params = {"ids": id_list, "queue": queue, "states": list(states),
              "reason": jsonvalue.safe_text(reason.strip(), limit=REASON_LIMIT)}
    attempt = 1
    while True:
        try:
            with conn.transaction(), conn.cursor(row_factory=typed_rows(sql.CancelledRow)) as cursor:
                return cursor.execute(sql.CANCEL_TASKS, params).fetchall()
        except psycopg.Error as exc:
            if not met_moved_row(exc) or attempt >= MOVED_ROW_ATTEMPTS:
                raise
            attempt += 1


def _task_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
        raise ValueError(f"not a task id: {value!r}")
    return value

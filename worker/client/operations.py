"""What operators and applications do to tasks and queues that exist: cancel and retry tasks;
pause, resume, rate-limit, cap and guard queues with a circuit breaker, and the keys of a queue.

Each call runs in the caller's transaction (inside a savepoint when one is open), like `enqueue`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from pydantic import TypeAdapter, ValidationError

from .. import jsonvalue
from ..db import statements
from ..db.connection import met_moved_row
from ..db.flow import (
    BREAKER_QUEUE, CLEAR_KEY_LIMITS, KEY_BREAKER_QUEUE, KEY_SETTINGS, LIMIT_QUEUE, PAUSE_KEY, PAUSE_QUEUE,
    QUEUE_SETTINGS, RESUME_KEY, RESUME_QUEUE, SET_KEY_LIMITS, BreakerQueueParams, KeyBreakerQueueParams, KeyParams,
    KeyRow, KeySettingsParams, LimitQueueParams, PauseKeyParams, PauseQueueParams, QueueRow, QueueSettingsParams,
    ResumeQueueParams, SetKeyLimitsParams)
from ..db.notify import NOTIFY_QUEUE, NotifyQueueParams
from ..db.statements import Params, Statement
from ..db.tasks import (
    CANCEL_TASKS, DEDUPE_HOLDER, RETRY_TASK, CancelledRow, CancelTasksParams, RetriedTaskRow, TaskParams)
from ..names import QueueName, TaskKey
from .inspect import task_states

_QUEUE_NAME = TypeAdapter(QueueName)
_TASK_KEY = TypeAdapter(TaskKey)
# A key's weight in its queue's fair share: claims per turn (a fraction: one claim every few turns).
MIN_KEY_WEIGHT, MAX_KEY_WEIGHT = 0.001, 1000.0

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
                states: Sequence[str] = CANCELLABLE, reason: str = "cancelled") -> list[CancelledRow]:
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
    params = CancelTasksParams(ids=id_list, queue=queue, states=list(states),
                               reason=jsonvalue.safe_text(reason.strip(), limit=REASON_LIMIT))
    attempt = 1
    while True:
        try:
            with conn.transaction():
                return statements.fetch(conn, CANCEL_TASKS, params)
        except psycopg.Error as exc:
            if not met_moved_row(exc) or attempt >= MOVED_ROW_ATTEMPTS:
                raise
            attempt += 1


class RetryRefused(ValueError):
    """A retry that changed nothing, and why (the task is unfinished, unknown, or its dedupe key is
    held by another unfinished task)."""


def retry(conn: psycopg.Connection, task_id: int) -> RetriedTaskRow:
    """Puts a failed or cancelled task back to pending (with one more attempt if it had spent
    them) and wakes its queue's workers. Raises RetryRefused when that is not possible, saying
    why: a task whose dedupe key another unfinished task holds is refused, since a retry would
    make two unfinished tasks with one key."""
    params = TaskParams(id=_task_id(task_id))

    def refuse_if_key_held() -> None:
        for holder in statements.fetch(conn, DEDUPE_HOLDER, params):
            raise RetryRefused(
                f"task {task_id} cannot be retried: its dedupe key {holder.dedupe_key!r} on queue {holder.queue} "
                f"is held by unfinished task {holder.id} ({holder.state}); retry it once that task has "
                "finished, or cancel that one first")

    attempt = 1
    while True:
        try:
            with conn.transaction():
                refuse_if_key_held()
                try:
                    with conn.transaction():
                        row = statements.fetch_one(conn, RETRY_TASK, params)
                except psycopg.errors.UniqueViolation:
                    refuse_if_key_held()  # taken between the check and the change
                    raise
                if row is None:
                    state = task_states(conn, [task_id]).get(task_id)
                    if state is None:
                        raise RetryRefused(f"no task with id {task_id}")
                    raise RetryRefused(f"task {task_id} is {state}; only failed or cancelled tasks can be retried")
                statements.execute(conn, NOTIFY_QUEUE, NotifyQueueParams(queue=row.queue))
                return row
        except psycopg.Error as exc:
            if not met_moved_row(exc) or attempt >= MOVED_ROW_ATTEMPTS:
                raise
            attempt += 1


def _task_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
        raise ValueError(f"not a task id: {value!r}")
    return value


# -- flow control (docs/flow-control.md) -------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DURATION_SECONDS = 365 * 86400
MAX_RATE_PER_SECOND = 1e6


def parse_duration(text: str) -> float:
    """'90', '90s', '5m', '2h', '1d' -> seconds (positive, at most a year)."""
    value = text.strip().lower()
    unit = _UNITS.get(value[-1:]) if value[-1:].isalpha() else 1
    number = value[:-1] if value[-1:].isalpha() else value
    try:
        seconds = float(number) * unit if unit else math.nan
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_DURATION_SECONDS:  # False for NaN
        raise ValueError(f"not a duration: {text!r} (a positive number with s, m, h or d, at most a year)")
    return seconds


def parse_rate(text: str) -> float:
    """'50/s', '300/m', '1000/h' -> tasks per second."""
    number, _, unit = text.strip().lower().partition("/")
    try:
        rate = float(number) / _UNITS[unit] if unit in _UNITS else math.nan
    except ValueError:
        rate = math.nan
    if not 0 < rate <= MAX_RATE_PER_SECOND:
        raise ValueError(f"not a rate: {text!r} (N/s, N/m, N/h or N/d; above 0, at most 1,000,000/s)")
    return rate


def pause(conn: psycopg.Connection, queue: str, *, seconds: float | None = None,
          key: str | None = None) -> QueueRow | KeyRow:
    """Claims skip the queue until resumed, or for `seconds`; running tasks finish. Workers wake
    when a timed pause ends. With `key`: claims pass over that key's tasks only (to the next key's)."""
    if seconds is not None and not (_is_number(seconds) and 0 < seconds <= MAX_DURATION_SECONDS):
        raise ValueError(f"pause for 0 to {MAX_DURATION_SECONDS:,} seconds, not {seconds!r}")
    until = None if seconds is None else datetime.now(timezone.utc) + timedelta(seconds=seconds)
    if key is not None:
        with conn.transaction():
            return statements.fetch_one(conn, PAUSE_KEY, PauseKeyParams(
                queue=_queue_name(queue), key=_task_key(key), until="infinity" if until is None else until,
                wake_at=until))
    return _change(conn, PAUSE_QUEUE, PauseQueueParams(
        queue=_queue_name(queue), until="infinity" if until is None else until, wake=until is not None, wake_at=until))


def resume(conn: psycopg.Connection, queue: str, *, key: str | None = None) -> QueueRow | KeyRow | None:
    """Ends a pause and wakes the queue's workers; None if the queue has no settings. With `key`:
    ends that key's pause (its waiting tasks take their place in line anew, behind the other keys'
    current turn); None if it was not paused."""
    if key is not None:
        with conn.transaction():
            return statements.fetch_one(conn, RESUME_KEY, KeyParams(queue=_queue_name(queue), key=_task_key(key)))
    return _change(conn, RESUME_QUEUE, ResumeQueueParams(queue=_queue_name(queue), wake=True, wake_at=None))


def set_limits(conn: psycopg.Connection, queue: str, *, rate_per_second: float | None = None,
               burst: int | None = None, max_running: int | None = None,
               per_key_rate_per_second: float | None = None, per_key_burst: int | None = None,
               per_key_max_running: int | None = None, key: str | None = None,
               weight: float | None = None) -> QueueRow | KeyRow | None:
    """A queue's limits, all at once (what is not given is removed): a rate limit (`burst` defaults
    to one second's worth, at least 1), a cap on the queue's running tasks across all workers, and
    the defaults of every key of the queue (docs/flow-control.md): a rate per key
    (`per_key_burst` as `burst`) and a cap on each key's running tasks; the tasks without a key
    count as one key.

    With `key`: that key's own settings, all at once (its pause is kept): its weight in the
    queue's fair share (`weight` claims per turn, 0.001 to 1000; None: 1), and a rate, burst and
    cap of its own in place of the queue's per-key defaults. With nothing but the key, its
    settings are cleared: returns those it had (None if it had none)."""
    if key is not None:
        if (per_key_rate_per_second, per_key_burst, per_key_max_running) != (None, None, None):
            raise ValueError("per-key defaults are the queue's: give them without a key")
        return _set_key_limits(conn, queue, key, weight, *_limits(rate_per_second, burst, max_running, ""))
    if weight is not None:
        raise ValueError("a weight is a key's: give the key")
    rate, burst, max_running = _limits(rate_per_second, burst, max_running, "")
    key_rate, key_burst, key_max_running = _limits(per_key_rate_per_second, per_key_burst, per_key_max_running,
                                                   "per_key_")
    return _change(conn, LIMIT_QUEUE, LimitQueueParams(
        queue=_queue_name(queue), rate=rate, burst=burst, max_running=max_running, key_rate=key_rate,
        key_burst=key_burst, key_max_running=key_max_running, wake=True, wake_at=None))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _limits(rate: float | None, burst: int | None, max_running: int | None,
            prefix: str) -> tuple[float | None, int | None, int | None]:
    """A bucket and a cap, checked (`prefix` names the arguments in the message); the burst
    defaults to one second's worth of the rate, at least 1."""
    if rate is not None and not (_is_number(rate) and 0 < rate <= MAX_RATE_PER_SECOND):  # NaN fails
        raise ValueError(f"{prefix}rate_per_second must be above 0 and at most {MAX_RATE_PER_SECOND:,.0f}")
    if burst is not None and (rate is None or not _is_whole(burst)):
        raise ValueError(f"{prefix}burst needs a rate, and is 1 to 1,000,000")
    if max_running is not None and not _is_whole(max_running):
        raise ValueError(f"{prefix}max_running is 1 to 1,000,000")
    if rate is not None and burst is None:
        burst = max(1, math.ceil(rate))
    return rate, burst, max_running


def _is_whole(value: object) -> bool:
    """A whole number from 1 to 1,000,000 (not a bool, not 2.5)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1_000_000


def _task_key(key: object) -> str:
    """The key, checked as TaskSpec checks it; the message never holds the key itself (it may hold
    control characters)."""
    try:
        return _TASK_KEY.validate_python(key)
    except ValidationError as exc:
        raise ValueError(f"the key: {exc.errors()[0]['msg']}") from None


def _set_key_limits(conn: psycopg.Connection, queue: str, key: str, weight: float | None, rate: float | None,
                    burst: int | None, max_running: int | None) -> KeyRow | None:
    if weight is not None and not _is_number(weight):
        raise ValueError("the weight must be a number")
    if weight is not None and not (math.isfinite(weight) and MIN_KEY_WEIGHT <= weight <= MAX_KEY_WEIGHT):
        raise ValueError(f"the weight is {MIN_KEY_WEIGHT:g} to {MAX_KEY_WEIGHT:g} claims per turn")
    params = KeyParams(queue=_queue_name(queue), key=_task_key(key))
    with conn.transaction():
        if (weight, rate, max_running) == (None, None, None):
            return statements.fetch_one(conn, CLEAR_KEY_LIMITS, params)
        return statements.fetch_one(conn, SET_KEY_LIMITS, SetKeyLimitsParams(
            queue=params.queue, key=params.key, weight=weight, rate=rate, burst=burst, max_running=max_running))


def set_breaker(conn: psycopg.Connection, queue: str, *, failures: int | None,
                cooldown_seconds: float | None = None, per_key: bool = False) -> QueueRow:
    """A circuit breaker: `failures` consecutive failures open it (claims skip the queue); after
    `cooldown_seconds` one probe task runs; its success closes it. failures=None removes it.
    per_key=True: a breaker for each key of the queue instead (migration 022), with the same rules
    per key: an open key loses its turn, the others are claimed as before."""
    if failures is not None:
        if not 1 <= failures <= 1_000_000:
            raise ValueError("failures is 1 to 1,000,000")
        if cooldown_seconds is None or not 0 < cooldown_seconds <= MAX_DURATION_SECONDS:
            raise ValueError("a breaker needs a cooldown of up to a year")
    if per_key:
        return _change(conn, KEY_BREAKER_QUEUE, KeyBreakerQueueParams(
            queue=_queue_name(queue), failures=failures, cooldown=None if failures is None else cooldown_seconds))
    return _change(conn, BREAKER_QUEUE, BreakerQueueParams(
        queue=_queue_name(queue), failures=failures, cooldown=None if failures is None else cooldown_seconds,
        wake=failures is None, wake_at=None))


def queue_settings(conn: psycopg.Connection, queue: str | None = None) -> list[QueueRow]:
    """Every queue's flow control settings (those with a row), or one queue's."""
    return statements.fetch(conn, QUEUE_SETTINGS, QueueSettingsParams(queue=queue))


def key_settings(conn: psycopg.Connection, queue: str, *, limit: int = 100) -> list[KeyRow]:
    """The keys of `queue` with settings of their own (weight, limits, pause), at most `limit`, by key."""
    return statements.fetch(conn, KEY_SETTINGS, KeySettingsParams(queue=_queue_name(queue), limit=limit))


def _queue_name(queue: str) -> str:
    """The queue, checked as TaskSpec checks it (pydantic's ValidationError otherwise)."""
    return _QUEUE_NAME.validate_python(queue)


def _change(conn: psycopg.Connection, statement: Statement[Any, QueueRow], params: Params) -> QueueRow | None:
    """Runs one change of a queue's settings; the settings as they are now, None if the change found no
    row (resume of a queue without settings)."""
    with conn.transaction():
        return statements.fetch_one(conn, statement, params)

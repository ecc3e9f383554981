"""Names and bounds every part of queueworker shares: what a queue or task name may be, the
largest numbers and durations the schema stores. A module of its own, imported by the producer,
the handlers, the settings and the cron schedules alike, so none of them imports another for them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, Field, StringConstraints

QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
DEFAULT_MAX_ATTEMPTS = 10
MAX_ATTEMPTS = 1000
MAX_TASK_NAME = 200
# The longest task key (TaskSpec.key): the CHECK tasks_key_text of migration 018 holds the same bound.
MAX_TASK_KEY = 256
# The largest value of a Postgres `integer` column (priority, max_attempts, timeout_seconds).
INT4_MAX = 2**31 - 1
# The longest duration accepted anywhere, in seconds (about 68 years): it fits an `integer`
# column, a timestamp that far ahead, and Python's timers (threading.TIMEOUT_MAX is ~292 years).
MAX_SECONDS = INT4_MAX
# When a task may be due: what every reader can hold (Python's datetime, years 1 to 9999, with a day
# to spare for time zones); the CHECK run_after_readable of migration 015.
EARLIEST_RUN_AFTER = datetime(2, 1, 1, tzinfo=UTC)
LATEST_RUN_AFTER = datetime(9999, 12, 30, tzinfo=UTC)


def printable(name: str) -> str:
    if not name.isprintable() or not name.strip():
        raise ValueError("must be printable text, without control characters")
    return name


def printable_or_empty(value: str) -> str:
    if not value.isprintable():
        raise ValueError("must be printable text, without control characters")
    return value


QueueName = Annotated[str, StringConstraints(pattern=QUEUE_PATTERN)]
"""Letters, digits and `_.:-`, starting with a letter or digit, at most 128 characters."""

TaskName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TASK_NAME), AfterValidator(printable)]
"""Any printable text up to 200 characters: no control characters, NUL or lone surrogates."""

DedupeKey = Annotated[str, StringConstraints(min_length=1, max_length=512), AfterValidator(printable)]
"""Any printable text up to 512 characters."""

TaskKey = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TASK_KEY), AfterValidator(printable_or_empty)]
"""Any printable text of 1 to 256 characters (`str.isprintable()`): the key a task is governed by
within its queue (docs/flow-control.md)."""


def task_key_ok(key: object) -> bool:
    """Whether `key` is a TaskKey as it is, without pydantic (the producer's fast path for plain dicts)."""
    return type(key) is str and 0 < len(key) <= MAX_TASK_KEY and key.isprintable()


TaskId = Annotated[int, Field(ge=1, le=2**63 - 1)]
MAX_PREREQUISITES = 1000

"""Enqueueing: the producer's statements (queueworker.client.producer). The statements are in enqueue.sql.

The parameter types of the variants with headers extend those without, and those with keys extend
those with headers: a batch without headers or keys leaves out the column, so a schema from before
migration 012 (headers) or 018 (keys) still takes it."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from .statements import JsonText, NoParams, Params, SqlFile

_SQL = SqlFile("enqueue")


class EnqueueParams(Params):
    """A batch of plain specs, one array element each, in spec order."""

    queues: list[str]
    tasks: list[str]
    payloads: list[JsonText]
    priorities: list[int]
    run_afters: list[datetime | None]  # None: due now, by the database's clock
    max_attempts: list[int]
    timeouts: list[int | None]


class EnqueuedRow(NamedTuple):
    id: int
    notified: int  # queues woken


class EnqueueOneParams(Params):
    """`enqueue_one`: one plain spec, its fields as `EnqueueParams` has them in its arrays."""

    queue: str
    task: str
    payload: JsonText
    priority: int
    run_after: datetime | None  # None: due now, by the database's clock
    max_attempts: int
    timeout: int | None
    headers: JsonText | None
    key: str | None


class EnqueueWithHeadersParams(EnqueueParams):
    headers: list[JsonText | None]


class EnqueueWithKeysParams(EnqueueWithHeadersParams):
    keys: list[str | None]  # TaskSpec.key


class StagingStateRow(NamedTuple):
    exists: bool
    allowed: bool
    spec_hash: bool


class EnqueueTasksParams(EnqueueParams):
    """A batch of unique or dependent specs, or of a run's partitions."""

    dedupe_keys: list[str | None]
    by_spec: list[bool]  # dedupe="spec": the spec hash is the key
    cancel_on_failure: list[bool]
    prerequisite_ords: list[int]  # the 1-based position of the spec that depends on ...
    prerequisite_ids: list[int]   # ... this task
    run_ids: list[int | None]
    run_partitions: list[int | None]


class TaskEnqueuedRow(NamedTuple):
    ord: int
    queue: str
    dedupe_key: str | None
    id: int | None  # None: another task holds the key (enqueue_existing finds it)
    notified: int


class EnqueueTasksWithHeadersParams(EnqueueTasksParams):
    headers: list[JsonText | None]


class EnqueueTasksWithKeysParams(EnqueueTasksWithHeadersParams):
    keys: list[str | None]


class EnqueueExistingParams(Params):
    ords: list[int]
    queues: list[str]
    dedupe_keys: list[str]


class ExistingTaskRow(NamedTuple):
    ord: int
    id: int
    state: str


class EnqueueReplaceParams(Params):
    ids: list[int]
    payloads: list[JsonText]
    priorities: list[int]
    run_afters: list[datetime | None]


class ReplacedRow(NamedTuple):
    id: int
    notified: int


class NotifyOnFinishParams(Params):
    ids: list[int]


class MarkedRow(NamedTuple):
    id: int


ENQUEUE = _SQL.statement("enqueue", EnqueueParams, EnqueuedRow)
ENQUEUE_ONE = _SQL.statement("enqueue_one", EnqueueOneParams, EnqueuedRow)
ENQUEUE_WITH_HEADERS = _SQL.statement("enqueue_with_headers", EnqueueWithHeadersParams, EnqueuedRow)
ENQUEUE_WITH_KEYS = _SQL.statement("enqueue_with_keys", EnqueueWithKeysParams, EnqueuedRow)
STAGING_STATE = _SQL.statement("staging_state", NoParams, StagingStateRow)
CREATE_STAGING = _SQL.statement("create_staging", NoParams)
EMPTY_STAGING = _SQL.statement("empty_staging", NoParams)
COPY_STAGING = _SQL.statement("copy_staging", NoParams)
COPY_STAGING_WITH_KEYS = _SQL.statement("copy_staging_with_keys", NoParams)
ENQUEUE_STAGED = _SQL.statement("enqueue_staged", NoParams, EnqueuedRow)
ENQUEUE_STAGED_WITH_HEADERS = _SQL.statement("enqueue_staged_with_headers", NoParams, EnqueuedRow)
ENQUEUE_STAGED_HASHED = _SQL.statement("enqueue_staged_hashed", NoParams, EnqueuedRow)
ENQUEUE_STAGED_WITH_HEADERS_HASHED = _SQL.statement("enqueue_staged_with_headers_hashed", NoParams, EnqueuedRow)
ENQUEUE_STAGED_WITH_KEYS = _SQL.statement("enqueue_staged_with_keys", NoParams, EnqueuedRow)
ENQUEUE_STAGED_WITH_KEYS_HASHED = _SQL.statement("enqueue_staged_with_keys_hashed", NoParams, EnqueuedRow)
ENQUEUE_TASKS = _SQL.statement("enqueue_tasks", EnqueueTasksParams, TaskEnqueuedRow)
ENQUEUE_TASKS_WITH_HEADERS = _SQL.statement("enqueue_tasks_with_headers", EnqueueTasksWithHeadersParams,
                                            TaskEnqueuedRow)
ENQUEUE_TASKS_WITH_KEYS = _SQL.statement("enqueue_tasks_with_keys", EnqueueTasksWithKeysParams, TaskEnqueuedRow)
ENQUEUE_EXISTING = _SQL.statement("enqueue_existing", EnqueueExistingParams, ExistingTaskRow)
ENQUEUE_REPLACE = _SQL.statement("enqueue_replace", EnqueueReplaceParams, ReplacedRow)
NOTIFY_ON_FINISH = _SQL.statement("notify_on_finish", NotifyOnFinishParams, MarkedRow)

_SQL.check_all_declared()

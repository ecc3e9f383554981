"""Enqueueing tasks, alone or in batches, inside the caller's own transaction.

Pass a psycopg connection: the insert joins whatever transaction is open on it, so a
task commits or rolls back together with the application's data. Workers are woken by
one NOTIFY per queue per call, delivered when that transaction commits.

Everything a task row holds is checked here, before the database sees it: names Postgres and
the worker's logs can carry, numbers its columns and Python's timers can hold, payloads `jsonb`
accepts. Bad input raises pydantic's ValidationError, naming the field and the rule.

Dependencies: a spec with `depends_on` (ids of existing tasks) starts `blocked` and becomes
`pending` once they have all succeeded; `enqueue_chain` makes each spec depend on the one before.
See docs/workflows.md.

Unique tasks: a spec with a `dedupe_key` (or `dedupe="spec"`, whose key is the task's spec hash)
is not enqueued while an unfinished task (pending, retrying, running) of its queue holds that key;
its id is that task's id. With `on_conflict="replace"`, a duplicate that is still pending takes the
new payload, priority and schedule instead (audited as a `replaced` event).

Keys: a task may carry a `key` (printable text of 1 to 256 characters), what it belongs to within
its queue (a tenant, a customer, a source); fair share and per-key limits build on it
(docs/flow-control.md). A task without one behaves as before.

Headers: a task carries `headers` (a small JSON object of strings) from its producer to its
attempts. When the `otel` extra is installed and a span is current, every enqueue here adds that
span's W3C trace context (`traceparent`, `tracestate`); headers given explicitly win over it. See
docs/observability.md.

Big batches: a batch with at least COPY_THRESHOLD plain specs (neither unique nor dependent) sends
them with COPY into a temporary staging table and inserts them from there in one statement, which
costs client and server far less per task than array parameters. The rows, ids, audit rows and
wake-ups are those of the plain INSERT. Unique and dependent specs always take the definer function
(a temporary table of the caller's is out of its reach), and so does a role without TEMPORARY on
the database. Plain dicts of the common fields are checked by `_plain_task` without building a
TaskSpec (any other input is left to TaskSpec, which accepts or refuses it as before).
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import AsyncExitStack, ExitStack
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Literal, NamedTuple

import psycopg
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from .. import jsonvalue, tracing
from ..db import statements
from ..db.enqueue import (
    COPY_STAGING, COPY_STAGING_WITH_KEYS, CREATE_STAGING, EMPTY_STAGING, ENQUEUE, ENQUEUE_EXISTING, ENQUEUE_REPLACE,
    ENQUEUE_STAGED, ENQUEUE_STAGED_HASHED, ENQUEUE_STAGED_WITH_HEADERS, ENQUEUE_STAGED_WITH_HEADERS_HASHED,
    ENQUEUE_STAGED_WITH_KEYS, ENQUEUE_STAGED_WITH_KEYS_HASHED, ENQUEUE_TASKS, ENQUEUE_TASKS_WITH_HEADERS,
    ENQUEUE_ONE, ENQUEUE_TASKS_WITH_KEYS, ENQUEUE_WITH_HEADERS, ENQUEUE_WITH_KEYS, NOTIFY_ON_FINISH,
    STAGING_STATE, EnqueueExistingParams, EnqueueOneParams, EnqueueReplaceParams, NotifyOnFinishParams)
from ..db.runs import START_RUN, StartRunParams
from ..db.statements import NO_PARAMS, NoParams, Params, Statement
from ..names import (
    DEFAULT_MAX_ATTEMPTS, EARLIEST_RUN_AFTER, INT4_MAX, LATEST_RUN_AFTER, MAX_ATTEMPTS, MAX_PREREQUISITES, MAX_SECONDS, MAX_TASK_NAME, QUEUE_PATTERN,
    DedupeKey, QueueName, TaskId, TaskKey, TaskName, printable, printable_or_empty, task_key_ok)

BATCH_SIZE = 5000
# The fewest plain specs of a batch that go through COPY (see the module's docstring): below it the
# staging table's set-up costs more than COPY saves.
COPY_THRESHOLD = 1000
# A batch of plain specs only grows to this size (one COPY and one INSERT each); one that holds a
# unique or dependent spec ends at BATCH_SIZE.
COPY_BATCH_SIZE = 50_000


HeaderName = Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(printable)]
"""Printable text up to 128 characters (W3C trace context needs `traceparent` and `tracestate`)."""
HeaderValue = Annotated[str, StringConstraints(max_length=1024), AfterValidator(printable_or_empty)]
"""Printable text up to 1,024 characters (a `tracestate` may hold 512)."""
MAX_HEADERS = 32
# What all of a task's headers may take, encoded: headers travel with every claim of the task.
MAX_HEADERS_BYTES = 8192


def _bounded_headers(headers: dict[str, str] | None) -> dict[str, str] | None:
    if headers is not None and len(jsonvalue.encode(headers)) > MAX_HEADERS_BYTES:
        raise ValueError(f"headers take more than {MAX_HEADERS_BYTES} bytes as JSON")
    return headers


Headers = Annotated[dict[HeaderName, HeaderValue] | None, Field(max_length=MAX_HEADERS),
                    AfterValidator(_bounded_headers)]


class TaskSpec(BaseModel):
    """One task to enqueue. Validated here so bad input fails before it reaches the database.

    The payload is encoded to JSON once, at validation: `payload_json` holds that text, and it is
    what the INSERT sends (derived from `payload`, never given)."""

    # Its validator is built by the first validation, not at import: a worker may never make one, and
    # starts sooner without.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    task: TaskName
    payload: Any = Field(default_factory=dict)
    queue: QueueName = "default"
    priority: int = Field(default=0, ge=-(2**31), le=INT4_MAX)
    run_after: datetime | None = None
    delay: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1, le=MAX_ATTEMPTS)
    timeout_seconds: int | None = Field(default=None, gt=0, le=INT4_MAX)
    dedupe_key: DedupeKey | None = None
    dedupe: Literal["spec"] | None = None
    on_conflict: Literal["ignore", "replace"] = "ignore"
    depends_on: Annotated[list[TaskId], Field(max_length=MAX_PREREQUISITES)] = Field(default_factory=list)
    on_dependency_failure: Literal["cancel", "run"] = "cancel"
    notify_on_finish: bool = False  # send a notification when it ends, for queueworker.wait_for
    headers: Headers = None  # string -> string, stored with the task (trace context: queueworker.tracing)
    key: TaskKey | None = None  # what the task belongs to within its queue (docs/flow-control.md)
    # A field rather than a private attribute: pydantic sets those up per instance, which costs
    # more than the encoding saved (this runs once per enqueued task).
    payload_json: str = Field(default="{}", exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _encoded_payload(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        if "payload_json" in values:
            raise ValueError("payload_json is derived from payload; give payload instead")
        if "payload" not in values:
            return values
        try:
            return {**values, "payload_json": jsonvalue.encode(values["payload"])}
        except jsonvalue.NotStorable as exc:
            raise ValueError(f"payload cannot be stored: {exc}") from None

    @model_validator(mode="after")
    def _one_aware_schedule(self) -> TaskSpec:
        if self.run_after is not None and self.run_after.tzinfo is None:
            raise ValueError("run_after must be timezone-aware")
        if self.run_after is not None and not EARLIEST_RUN_AFTER <= self.run_after <= LATEST_RUN_AFTER:
            raise ValueError(f"run_after must lie from {EARLIEST_RUN_AFTER.date().isoformat()} to "
                             f"{LATEST_RUN_AFTER.date().isoformat()} (UTC)")
        if self.run_after is not None and self.delay is not None:
            raise ValueError("give run_after or delay, not both")
        if self.dedupe_key is not None and self.dedupe is not None:
            raise ValueError('give dedupe_key or dedupe="spec", not both')
        if self.on_conflict == "replace" and not self.unique:
            raise ValueError('on_conflict="replace" needs a dedupe_key or dedupe="spec"')
        if len(set(self.depends_on)) != len(self.depends_on):
            raise ValueError("depends_on lists a task twice")
        return self

    @property
    def plain(self) -> bool:
        """Neither unique nor dependent: enqueued by the plain INSERT (enqueue.sql's `enqueue`, or
        a statement like it)."""
        return not self.unique and not self.depends_on

    @property
    def unique(self) -> bool:
        """Whether at most one unfinished task per queue may have this spec's key."""
        return self.dedupe_key is not None or self.dedupe is not None

    def due_at(self, now: datetime) -> datetime | None:
        """The absolute run_after, or None for 'now' (decided by the database clock)."""
        return _due_at(self.run_after, self.delay, now)


def _due_at(run_after: datetime | None, delay: float | None, now: datetime) -> datetime | None:
    if delay:
        return now + timedelta(seconds=delay)
    return run_after


class PlainTask(NamedTuple):
    """A plain spec (neither unique nor dependent, no finish notification, no headers of its own)
    that `_plain_task` checked: what a dict of the common fields becomes without a TaskSpec, whose
    validation costs several times more. Read like a TaskSpec by `_columns` and `_plan`."""

    task: str
    payload_json: str
    queue: str
    priority: int
    run_after: datetime | None
    delay: float | None
    max_attempts: int
    timeout_seconds: int | None
    key: str | None = None
    headers: None = None
    plain = True
    notify_on_finish = False

    def due_at(self, now: datetime) -> datetime | None:
        return _due_at(self.run_after, self.delay, now)


_QUEUE = re.compile(QUEUE_PATTERN)
_PLAIN_FIELDS = frozenset({"task", "payload", "queue", "priority", "run_after", "delay", "max_attempts",
                           "timeout_seconds", "key"})
_DEFAULT_QUEUE: str = TaskSpec.model_fields["queue"].default


def _number(value: Any, low: float, high: float) -> bool:
    """An int (or, with float bounds, a float) that TaskSpec takes unchanged, within the bounds."""
    return (type(value) is int or (type(value) is float and type(low) is float)) and low <= value <= high


def _plain_task(values: Any) -> PlainTask | None:
    """`values` checked against TaskSpec's rules without pydantic, when it is a dict of the common
    fields with values of exactly the types TaskSpec stores; None for anything else (a coercion, an
    unusual field, a bad value), which TaskSpec then accepts or refuses with its own message. Never
    accepts what TaskSpec refuses, nor stores anything differently (a property test checks both)."""
    if type(values) is not dict or not values.keys() <= _PLAIN_FIELDS:
        return None
    task = values.get("task")
    queue = values.get("queue", _DEFAULT_QUEUE)
    priority = values.get("priority", 0)
    max_attempts = values.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    timeout = values.get("timeout_seconds")
    run_after = values.get("run_after")
    delay = values.get("delay")
    key = values.get("key")
    if not (type(task) is str and 0 < len(task) <= MAX_TASK_NAME and task.isprintable() and task.strip()
            and type(queue) is str and _QUEUE.fullmatch(queue)
            and _number(priority, -(2**31), INT4_MAX) and _number(max_attempts, 1, MAX_ATTEMPTS)
            and (timeout is None or _number(timeout, 1, INT4_MAX))
            and (key is None or task_key_ok(key))
            and (delay is None or _number(delay, 0.0, float(MAX_SECONDS)))
            and (run_after is None or (type(run_after) is datetime and run_after.utcoffset() is not None
                                       and EARLIEST_RUN_AFTER <= run_after <= LATEST_RUN_AFTER
                                       and delay is None))):
        return None
    try:
        payload_json = jsonvalue.encode(values["payload"]) if "payload" in values else "{}"
    except jsonvalue.NotStorable:
        return None
    return PlainTask(task, payload_json, queue, priority, run_after, None if delay is None else float(delay),
                     max_attempts, timeout, key)


def _headers_json(spec: TaskSpec, trace_context: dict[str, str] | None) -> str | None:
    """The headers stored with the task: the current trace context, then the spec's own over it."""
    if trace_context is None:
        return None if spec.headers is None else jsonvalue.encode(spec.headers)
    return jsonvalue.encode(trace_context if spec.headers is None else {**trace_context, **spec.headers})


def _columns(specs: Sequence[TaskSpec | PlainTask]) -> dict[str, list]:
    """The specs column by column, as every enqueue statement takes them (and the staging table holds
    them): the parameters the statements have in common, and each spec's headers and key."""
    now = datetime.now(timezone.utc)
    trace_context = tracing.current_headers()
    return {
        "queues": [s.queue for s in specs],
        "tasks": [s.task for s in specs],
        "payloads": [s.payload_json for s in specs],  # text, cast to jsonb[] by the statement
        "priorities": [s.priority for s in specs],
        "run_afters": [s.due_at(now) for s in specs],
        "max_attempts": [s.max_attempts for s in specs],
        "timeouts": [s.timeout_seconds for s in specs],
        "headers": [_headers_json(s, trace_context) for s in specs],  # text, cast to jsonb[] like payloads
        "keys": [s.key for s in specs],
    }


def _stored(columns: dict[str, list]) -> tuple[bool, bool]:
    """Whether some spec of the batch has headers, and whether some has a key."""
    return (any(headers is not None for headers in columns["headers"]),
            any(key is not None for key in columns["keys"]))


def _insert(variants: tuple[Statement[Any, Any], Statement[Any, Any], Statement[Any, Any]], columns: dict[str, list],
            **more: list) -> Step:
    """The step inserting a batch: of the three `variants` (without headers or keys, with headers, with
    headers and keys), the first that stores what the batch has, so a schema from before headers
    (migration 012) or keys (migration 018) still takes batches without them. `more` are the
    parameters beyond the columns."""
    without, with_headers, with_keys = variants
    headers, keys = _stored(columns)
    if keys:
        return with_keys, with_keys.params(**columns, **more)
    left_out = {"keys"} if headers else {"headers", "keys"}
    statement = with_headers if headers else without
    return statement, statement.params(**{name: values for name, values in columns.items() if name not in left_out},
                                       **more)


def _insert_special(specs: Sequence[TaskSpec], run_id: int | None = None,
                    partitions: Sequence[int | None] | None = None) -> Step:
    """The step inserting unique or dependent specs, or a run's partitions (enqueue_tasks): the columns,
    the keys, the edges by 1-based spec position, and the run and partition number of each spec (for a
    run's partitions)."""
    edges = [(position, prerequisite) for position, spec in enumerate(specs, 1) for prerequisite in spec.depends_on]
    return _insert((ENQUEUE_TASKS, ENQUEUE_TASKS_WITH_HEADERS, ENQUEUE_TASKS_WITH_KEYS), _columns(specs),
                   dedupe_keys=[s.dedupe_key for s in specs],
                   run_ids=[run_id] * len(specs), run_partitions=list(partitions or [None] * len(specs)),
                   by_spec=[s.dedupe == "spec" for s in specs],
                   cancel_on_failure=[s.on_dependency_failure == "cancel" for s in specs],
                   prerequisite_ords=[position for position, _ in edges],
                   prerequisite_ids=[prerequisite for _, prerequisite in edges])


def _batches(specs: Iterable[TaskSpec | dict]) -> Iterable[list[TaskSpec | PlainTask]]:
    batch: list[TaskSpec | PlainTask] = []
    special = False  # whether the batch holds a unique or dependent spec
    for spec in specs:
        checked = spec if isinstance(spec, TaskSpec) else _plain_task(spec) or TaskSpec(**spec)
        batch.append(checked)
        special = special or not checked.plain
        if len(batch) >= (BATCH_SIZE if special else COPY_BATCH_SIZE):
            yield batch
            batch, special = [], False
    if batch:
        yield batch


class Enqueued(NamedTuple):
    """A batch's outcome: the ids in spec order, and the positions of the specs that found their key
    held by another task (their id is that task's)."""

    ids: list[int]
    duplicates: list[int]


class Copy(NamedTuple):
    """A plan step that loads rows with COPY: `prepare` first (a statement without rows), then
    `statement` (a COPY ... FROM STDIN) takes `rows`. Text format: Postgres parses payloads into
    the staging table's jsonb columns while the rows arrive, where binary COPY would take them as
    text and cast them in the insert; psycopg writes binary rows only a little faster (33 against
    51 ms per 100,000 rows, measured 2026-11-26)."""

    prepare: Statement[NoParams, None]
    statement: Statement[NoParams, None]
    rows: Iterable[tuple]


# A batch's statements, as a generator: it yields a statement with its parameters, or a Copy, is sent
# the statement's rows (none for a Copy), and returns what was enqueued. One plan, driven by a sync and
# by an async connection.
Step = tuple[Statement[Any, Any], Params] | Copy
Plan = Generator[Step, list, Enqueued]

# How often a duplicate whose holder vanished between the insert and the lookup (it finished and
# was cleaned up in that instant) is enqueued again before giving up.
UNIQUE_ROUNDS = 3


# The insert from the staging table, by what the batch has (_stored: headers, keys; a batch with keys
# takes the statement that stores both) and whether the role may set the spec hash (staging_state says).
_ENQUEUE_STAGED = {
    (False, False, False): ENQUEUE_STAGED, (True, False, False): ENQUEUE_STAGED_WITH_HEADERS,
    (False, False, True): ENQUEUE_STAGED_HASHED, (True, False, True): ENQUEUE_STAGED_WITH_HEADERS_HASHED,
    (False, True, False): ENQUEUE_STAGED_WITH_KEYS, (True, True, False): ENQUEUE_STAGED_WITH_KEYS,
    (False, True, True): ENQUEUE_STAGED_WITH_KEYS_HASHED, (True, True, True): ENQUEUE_STAGED_WITH_KEYS_HASHED}


def _staged_rows(columns: dict[str, list], keys: bool) -> Iterator[tuple]:
    """The columns as the staging table's rows (in the order of enqueue.sql's copy_staging, or, with
    `keys`, copy_staging_with_keys)."""
    common = (range(len(columns["queues"])), columns["queues"], columns["tasks"], columns["payloads"],
              columns["priorities"], columns["run_afters"], columns["max_attempts"], columns["timeouts"],
              columns["headers"])
    return zip(*common, columns["keys"]) if keys else zip(*common)


def _copies(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """Whether a batch on `conn` may go through COPY: not in pipeline mode, which has no COPY."""
    return conn.info.pipeline_status == psycopg.pq.PipelineStatus.OFF


def _insert_plain(specs: Sequence[TaskSpec | PlainTask], copy: bool) -> Generator[Step, list, list[int]]:
    """Inserts plain specs, with COPY (if `copy`) when there are COPY_THRESHOLD of them and the role
    may create the staging table; returns their ids in order."""
    columns = _columns(specs)
    if copy and len(specs) >= COPY_THRESHOLD:
        state = (yield STAGING_STATE, NO_PARAMS)[0]
        if state.allowed:
            headers, keys = _stored(columns)
            yield Copy(EMPTY_STAGING if state.exists else CREATE_STAGING,
                       COPY_STAGING_WITH_KEYS if keys else COPY_STAGING, _staged_rows(columns, keys))
            rows = yield _ENQUEUE_STAGED[headers, keys, state.spec_hash], NO_PARAMS
            return [row.id for row in rows]
    if len(specs) == 1:  # the common case, by a statement that costs the server less to plan
        one = {name: values[0] for name, values in columns.items()}
        rows = yield ENQUEUE_ONE, EnqueueOneParams(
            queue=one["queues"], task=one["tasks"], payload=one["payloads"], priority=one["priorities"],
            run_after=one["run_afters"], max_attempts=one["max_attempts"], timeout=one["timeouts"],
            headers=one["headers"], key=one["keys"])
    else:
        rows = yield _insert((ENQUEUE, ENQUEUE_WITH_HEADERS, ENQUEUE_WITH_KEYS), columns)
    return [row.id for row in rows]


def _plan(batch: Sequence[TaskSpec | PlainTask], run: tuple[int, int] | None = None, copy: bool = False) -> Plan:
    """With `run` = (run id, number of the batch's first partition) every spec is a partition; with
    `copy`, plain specs may go through COPY (see _copies)."""
    ids: list[int | None] = [None] * len(batch)
    plain = [i for i, spec in enumerate(batch) if spec.plain and run is None]
    if plain:
        plain_ids = yield from _insert_plain([batch[i] for i in plain], copy)
        for i, task_id in zip(plain, plain_ids):
            ids[i] = task_id
    pending = [i for i, spec in enumerate(batch) if not spec.plain or run is not None]
    duplicates: list[int] = []  # specs whose key another task held (within the batch too)
    for _ in range(UNIQUE_ROUNDS):
        if not pending:
            break
        rows = yield _insert_special([batch[i] for i in pending], run[0] if run else None,
                                     [run[1] + i for i in pending] if run else None)
        missing = []
        for i, row in zip(pending, rows):
            if row.id is None:
                missing.append((i, row))
            else:
                ids[i] = row.id
        pending = [i for i, _ in missing]
        if not missing:
            break
        found = yield ENQUEUE_EXISTING, EnqueueExistingParams(ords=[i for i, _ in missing],
                                                              queues=[row.queue for _, row in missing],
                                                              dedupe_keys=[row.dedupe_key for _, row in missing])
        for row in found:
            ids[row.ord] = row.id
            duplicates.append(row.ord)
        pending = [i for i in pending if ids[i] is None]
    if pending:
        raise RuntimeError(f"could not enqueue {len(pending)} unique tasks: their keys kept changing hands")
    replace = [i for i in duplicates if batch[i].on_conflict == "replace"]
    if replace:
        columns = _columns([batch[i] for i in replace])
        yield ENQUEUE_REPLACE, EnqueueReplaceParams(ids=[ids[i] for i in replace], payloads=columns["payloads"],
                                                    priorities=columns["priorities"], run_afters=columns["run_afters"])
    notify = [ids[i] for i, spec in enumerate(batch) if spec.notify_on_finish]
    if notify:
        yield NOTIFY_ON_FINISH, NotifyOnFinishParams(ids=notify)
    return Enqueued(ids, sorted(duplicates))


def _copy_needs_transaction(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """Whether a COPY step must open a transaction first: on an autocommit connection outside one,
    the staging table (ON COMMIT DROP) has to last from the COPY to the insert that reads it.
    Batches without COPY run as before: one statement, with no BEGIN and COMMIT around it."""
    return conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def _run(conn: psycopg.Connection, plan: Plan) -> Enqueued:
    """Runs a batch's plan in the caller's transaction, or (autocommit) statement by statement,
    from its COPY on in a transaction of its own."""
    rows: list | None = None
    with ExitStack() as transaction:
        try:
            while True:
                step = plan.send(rows)
                if isinstance(step, Copy):
                    if _copy_needs_transaction(conn):
                        transaction.enter_context(conn.transaction())
                    statements.execute(conn, step.prepare, NO_PARAMS)
                    statements.copy_rows(conn, step.statement, step.rows)
                    rows = []
                else:
                    rows = statements.fetch(conn, *step)
        except StopIteration as done:
            return done.value


async def _run_async(conn: psycopg.AsyncConnection, plan: Plan) -> Enqueued:
    """The asyncio twin of _run()."""
    rows: list | None = None
    async with AsyncExitStack() as transaction:
        try:
            while True:
                step = plan.send(rows)
                if isinstance(step, Copy):
                    if _copy_needs_transaction(conn):
                        await transaction.enter_async_context(conn.transaction())
                    await statements.execute_async(conn, step.prepare, NO_PARAMS)
                    await statements.copy_rows_async(conn, step.statement, step.rows)
                    rows = []
                else:
                    rows = await statements.fetch_async(conn, *step)
        except StopIteration as done:
            return done.value


def enqueue(conn: psycopg.Connection, task: str, payload: Any = None, **options: Any) -> int:
    """Enqueues one task; returns its id (the existing task's, for a unique duplicate). Options are
    the fields of TaskSpec."""
    spec = TaskSpec(task=task, payload={} if payload is None else payload, **options)
    return enqueue_many(conn, [spec])[0]


def enqueue_many(conn: psycopg.Connection, specs: Iterable[TaskSpec | dict]) -> list[int]:
    """Enqueues many tasks in batches of BATCH_SIZE rows per statement (COPY_BATCH_SIZE, through
    COPY, while they are all plain); returns ids in order."""
    return [task_id for batch in _batches(specs) for task_id in enqueue_batch(conn, batch).ids]


def enqueue_batch(conn: psycopg.Connection, batch: Sequence[TaskSpec | PlainTask]) -> Enqueued:
    """Enqueues up to BATCH_SIZE specs (COPY_BATCH_SIZE plain ones); says which were unique duplicates
    (for the CLI's report)."""
    return _run(conn, _plan(batch, copy=_copies(conn)))


def _stage(spec: TaskSpec | dict, previous: list[int]) -> TaskSpec:
    """A pipeline stage: `spec`, depending on the stage before it as well."""
    fields = spec.model_dump(exclude_unset=True) if isinstance(spec, TaskSpec) else dict(spec)
    return TaskSpec(**{**fields, "depends_on": [*previous, *fields.get("depends_on", [])]})


def enqueue_chain(conn: psycopg.Connection, specs: Iterable[TaskSpec | dict]) -> list[int]:
    """Enqueues a staged pipeline: each spec depends on the one before it (and on its own
    `depends_on`), so stage N+1 is `blocked` until stage N has succeeded, and is cancelled if stage N
    fails for good. One statement per stage; returns the ids in order."""
    ids: list[int] = []
    for spec in specs:
        ids.extend(enqueue_batch(conn, [_stage(spec, ids[-1:])]).ids)
    return ids


def _run_task_spec(spec: TaskSpec | dict | None) -> str | None:
    """A run's consolidation or alert, as the run row stores it (JSON; enqueued when due)."""
    if spec is None:
        return None
    spec = spec if isinstance(spec, TaskSpec) else TaskSpec(**spec)
    if not spec.plain or spec.run_after or spec.delay or spec.notify_on_finish or spec.headers:
        raise ValueError("a run's on_success/on_failure task takes task, payload, queue, priority, max_attempts, "
                         "timeout_seconds and key only")
    return json.dumps({"task": spec.task, "queue": spec.queue, "payload": json.loads(spec.payload_json),
                       "priority": spec.priority, "max_attempts": spec.max_attempts,
                       "timeout_seconds": spec.timeout_seconds, **({} if spec.key is None else {"key": spec.key})})


def start_run(conn: psycopg.Connection, name: str, partitions: Iterable[TaskSpec | dict], *,
              on_success: TaskSpec | dict | None = None, on_failure: TaskSpec | dict | None = None,
              watermark: str | None = None) -> int:
    """Starts a partitioned run in the caller's transaction: one task per partition (numbered from
    0 in order), counted as they end. When every partition has succeeded, `on_success` (the
    consolidation) is enqueued once; when one ends failed or cancelled, the run fails and
    `on_failure` (the alert) is enqueued once. The run succeeds, and the watermark named
    `watermark` advances to the run's start, only when the consolidation succeeds (or, without one,
    when the last partition does). Returns the run's id."""
    specs = [spec if isinstance(spec, TaskSpec) else TaskSpec(**spec) for spec in partitions]
    if not specs:
        raise ValueError("a run needs at least one partition")
    if any(spec.unique for spec in specs):  # a unique task may turn out to be another, which the run cannot count
        raise ValueError('a run\'s partitions cannot be unique tasks (dedupe_key or dedupe="spec"): each is a task '
                         'of the run\'s own, counted by it')
    if not 1 <= len(name) <= 200 or not name.isprintable():
        raise ValueError("a run's name is printable text of 1 to 200 characters")
    params = StartRunParams(name=name, expected=len(specs), on_success=_run_task_spec(on_success),
                            on_failure=_run_task_spec(on_failure), watermark=watermark,
                            queues=sorted({spec.queue for spec in specs}))
    run_id = statements.fetch(conn, START_RUN, params)[0].id
    for first in range(0, len(specs), BATCH_SIZE):
        _run(conn, _plan(specs[first:first + BATCH_SIZE], (run_id, first)))
    return run_id


async def enqueue_async(conn: psycopg.AsyncConnection, task: str, payload: Any = None, **options: Any) -> int:
    """The asyncio twin of enqueue()."""
    spec = TaskSpec(task=task, payload={} if payload is None else payload, **options)
    return (await enqueue_many_async(conn, [spec]))[0]


async def enqueue_many_async(conn: psycopg.AsyncConnection, specs: Iterable[TaskSpec | dict]) -> list[int]:
    """The asyncio twin of enqueue_many()."""
    ids: list[int] = []
    for batch in _batches(specs):
        ids.extend((await _run_async(conn, _plan(batch, copy=_copies(conn)))).ids)
    return ids


async def enqueue_chain_async(conn: psycopg.AsyncConnection, specs: Iterable[TaskSpec | dict]) -> list[int]:
    """The asyncio twin of enqueue_chain()."""
    ids: list[int] = []
    for spec in specs:
        ids.extend((await _run_async(conn, _plan([_stage(spec, ids[-1:])]))).ids)
    return ids

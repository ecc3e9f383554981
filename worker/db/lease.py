"""The statements of a worker's lease loop (queueworker.runtime): claim, heartbeat, checkpoint,
complete, hand back and release. The statements are in lease.sql; the claim and the completions
are the hot path."""

from __future__ import annotations

import re
import textwrap
from typing import NamedTuple
from uuid import UUID

from .statements import NO_PARAMS, Bound, JsonText, NoParams, Params, SqlFile, Statement

_SQL = SqlFile("lease")


class ClaimParams(Params):
    """`claim`, `claim_limited` and their fair-share variants: up to `limit` tasks of `queue`, leased to `worker` for
    `lease_seconds`, with `timeout_seconds` as the deadline of tasks that set none."""

    queue: str
    limit: int
    worker: UUID
    lease_seconds: float
    timeout_seconds: float


class KeyClaimParams(ClaimParams):
    """`claim_keys`: a claim of a key-limited queue, passing over `held_keys` (keys a failure of which
    this worker has not yet reported to their breaker; '' for the tasks without a key) besides the
    keys the database holds."""

    held_keys: list[str]


class ClaimedRow(NamedTuple):
    """A task a claim just leased. The payload stays JSON text here: each attempt decodes its own,
    so a row Python cannot read (nested 2,000 deep, a 5,000-digit number) fails only that task."""

    id: int
    queue: str
    task: str
    payload_json: str
    attempts: int
    max_attempts: int
    lease_token: int
    seconds_to_deadline: float
    run_json: str | None  # the run a partition, consolidation or alert belongs to (RunInfo); else None
    checkpoint_json: str | None  # what an earlier attempt saved with ctx.save_checkpoint
    headers_json: str | None  # the producer's headers (trace context), read by queueworker.tracing
    key: str | None  # TaskSpec.key (migration 018): TaskContext.key


class LockQueueParams(Params):
    queue: str


class RegisterWorkerParams(Params):
    """A worker's `workers` row."""

    worker: UUID
    hostname: str
    pod_name: str | None
    pod_namespace: str | None
    pid: int
    queues: list[str]
    concurrency: int
    running: int
    draining: bool
    version: str


class HeartbeatParams(RegisterWorkerParams):
    """The worker's row, and the leases it holds (with the progress their handlers last reported)
    to extend by `lease_seconds`."""

    lease_seconds: float
    ids: list[int]
    tokens: list[int]
    progresses: list[JsonText | None]


class HeldRow(NamedTuple):
    """A lease the heartbeat found still held, and whether it was extended: not when past its
    deadline (the worker's own deadline then cancels the attempt and reports it), nor when another
    transaction had its row locked (the next beat tries again)."""

    id: int
    lease_token: int
    extended: bool


class SaveCheckpointParams(Params):
    checkpoint: JsonText
    progress: JsonText | None
    id: int
    token: int


class FencedRow(NamedTuple):
    """A row a fenced statement changed: which attempt of which task."""

    id: int
    lease_token: int


class CancelledAmongParams(Params):
    ids: list[int]


class CancelledTaskRow(NamedTuple):
    id: int


class CancelledLeasesParams(Params):
    """Attempts, as two arrays of the same length: task ids and their lease tokens."""

    ids: list[int]
    tokens: list[int]


class DeregisterWorkerParams(Params):
    """A worker, by id: `deregister_worker`, and `release` of every lease it still holds."""

    worker: UUID


class CompleteSucceededParams(Params):
    """One entry per attempt, in step: task ids, lease tokens, results (None: the handler returned none)."""

    ids: list[int]
    tokens: list[int]
    results: list[JsonText | None]


class CompleteContinuedParams(Params):
    """As CompleteSucceededParams, and each next page: its payload, its delay, its headers (None:
    the task's own)."""

    ids: list[int]
    tokens: list[int]
    results: list[JsonText | None]
    next_payloads: list[JsonText]
    next_delays: list[float]
    next_headers: list[JsonText | None]


class CompleteFailedParams(Params):
    """One entry per attempt, in step: whether it may be retried, after which backoff, and its error."""

    ids: list[int]
    tokens: list[int]
    retryables: list[bool]
    backoffs: list[float]
    errors: list[JsonText]


class FailedRow(NamedTuple):
    """A failed attempt as recorded: `retrying` (backoff) or `failed`."""

    id: int
    lease_token: int
    state: str


class ReleasedRow(NamedTuple):
    """A task handed back by `release`; `notified` is the same in every row: the queues woken."""

    id: int
    queue: str
    notified: int


class HandBackParams(Params):
    """One entry per attempt, in step: its delay, its error, and the grace period within which
    (since the task was created) it may be handed back at all (None: always, a snooze)."""

    ids: list[int]
    tokens: list[int]
    delays: list[float]
    errors: list[JsonText]
    graces: list[float | None]


CLAIM = _SQL.statement("claim", ClaimParams, ClaimedRow)
LOCK_QUEUE = _SQL.statement("lock_queue", LockQueueParams)
LOCK_KEYS = _SQL.statement("lock_keys", LockQueueParams)
CLAIM_LIMITED = _SQL.statement("claim_limited", ClaimParams, ClaimedRow)
CLAIM_FAIR = _SQL.statement("claim_fair", ClaimParams, ClaimedRow)
# The claims that lock no queue as a worker with --async-claim-commit (the default) runs them: the
# same claims, committed without waiting for the disk.
ASYNC_COMMIT_CLAIMS = {CLAIM: _SQL.statement("claim_async_commit", ClaimParams, ClaimedRow),
                       CLAIM_FAIR: _SQL.statement("claim_fair_async_commit", ClaimParams, ClaimedRow)}
CLAIM_LIMITED_FAIR = _SQL.statement("claim_limited_fair", ClaimParams, ClaimedRow)
CLAIM_KEYS = _SQL.statement("claim_keys", KeyClaimParams, ClaimedRow)
REGISTER_WORKER = _SQL.statement("register_worker", RegisterWorkerParams)
HEARTBEAT = _SQL.statement("heartbeat", HeartbeatParams, HeldRow)
SAVE_CHECKPOINT = _SQL.statement("save_checkpoint", SaveCheckpointParams, FencedRow)
CANCELLED_AMONG = _SQL.statement("cancelled_among", CancelledAmongParams, CancelledTaskRow)
CANCELLED_LEASES = _SQL.statement("cancelled_leases", CancelledLeasesParams, FencedRow)
DEREGISTER_WORKER = _SQL.statement("deregister_worker", DeregisterWorkerParams)
# What runs first in the transaction of `complete_succeeded`: its generic plan.
GENERIC_COMPLETION = Bound(_SQL.statement("completion_settings", NoParams), NO_PARAMS)
COMPLETE_SUCCEEDED = _SQL.statement("complete_succeeded", CompleteSucceededParams, FencedRow)
COMPLETE_CONTINUED = _SQL.statement("complete_continued", CompleteContinuedParams, FencedRow)
COMPLETE_FAILED = _SQL.statement("complete_failed", CompleteFailedParams, FailedRow)
RELEASE = _SQL.statement("release", DeregisterWorkerParams, ReleasedRow)
HAND_BACK = _SQL.statement("hand_back", HandBackParams, FencedRow)

_SQL.check_all_declared()


def claim_function_statement(claim: Statement[ClaimParams, ClaimedRow]) -> str:
    """The statement run by the function `claim` calls (`claim`, `claim_fair`, or their asynchronous
    forms), as migrations/functions/35_claims.sql writes it, with the claim's placeholders in place of
    the function's arguments: for what prepares, explains or measures it on its own (bench/, the tests
    of its plans). Not for the worker's own use, which only calls the function: its files are read
    here, when asked."""
    from .migrate import available_functions
    function = re.search(r"FROM queueworker\.(\w+)\(", claim.text)[1]
    text = next(f.text for f in available_functions() if f"FUNCTION queueworker.{function}(" in f.text)
    body = text.split(f"FUNCTION queueworker.{function}(", 1)[1].split("RETURN QUERY", 1)[1].split(";\nEND", 1)[0]
    return re.sub(r"\$(\d)\b", lambda match: f"%({ClaimParams._fields[int(match[1]) - 1]})s",
                  textwrap.dedent(body)).strip()

"""One leased attempt held by a worker, from claim until its outcome is flushed or released."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .handlers import TaskContext


@dataclass(eq=False)
class Attempt:
    id: int
    token: int
    queue: str
    task: str
    payload_json: str  # decoded by the attempt itself, so one undecodable row fails only its own task
    attempt: int
    max_attempts: int
    deadline: float  # event-loop time of the hard deadline
    ctx: TaskContext
    lease_expires: float  # event-loop time the lease runs out unless a heartbeat extends it
    run_json: str | None = None  # RunInfo as JSON, decoded by the attempt like its payload
    checkpoint_json: str | None = None  # what an earlier attempt saved, decoded likewise
    headers_json: str | None = None  # the producer's headers: its trace context (queueworker.tracing)
    runner: asyncio.Task | None = None
    reporting: bool = False   # handler finished; outcome waits in the completer
    failed: bool = False      # ... and that outcome is a failure (a circuit breaker counts it)
    abandoned: bool = False   # lease lost, fenced or released: any outcome is discarded
    outcome: str = ""         # once reported, the outcome's label (logs, the summary line, the span)
    started: float = field(default=0.0)
    # (task id, lease token): a task id alone repeats when a task comes back to this worker
    # (retried, rescued), and a late outcome of the old attempt must not touch the new one.
    key: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.key = (self.id, self.token)

    @property
    def settled(self) -> bool:
        """Its outcome is on its way, or it was abandoned: whatever its handler ends with now is
        discarded."""
        return self.reporting or self.abandoned

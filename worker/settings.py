"""Worker settings, validated once at start-up so bad flags fail with one clear message."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .producer import QUEUE_PATTERN


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    queues: tuple[str, ...] = ("default",)
    concurrency: int = Field(default=10, ge=1, le=10000)
    lease_seconds: float = Field(default=30.0, ge=2.0)
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    drain_seconds: float = Field(default=20.0, ge=0)
    task_timeout_seconds: float = Field(default=1800.0, gt=0)
    # Background duties. Unset intervals follow the lease: a SIGKILLed worker's tasks are back in
    # the queue at most lease + lease/4 after its last heartbeat (37.5 s with the defaults).
    rescue_interval_seconds: float | None = Field(default=None, gt=0)
    deadline_grace_seconds: float = Field(default=60.0, ge=0)
    worker_ttl_seconds: float | None = Field(default=None, gt=0)
    # Every way work appears (enqueue, release, rescue, promotion, retry) sends a NOTIFY, so the
    # scheduler's and the fetch loop's own timers are only safety nets: keep them cheap when idle.
    scheduler_max_interval_seconds: float = Field(default=30.0, gt=0)
    # History: finished tasks older than this are deleted with their audit rows (0 keeps them).
    retention_seconds: float = Field(default=7 * 24 * 3600.0, ge=0)
    cleaner_interval_seconds: float = Field(default=300.0, gt=0)
    # Idle polling fallback behind LISTEN/NOTIFY: grows from min to max while nothing is found.
    poll_min_seconds: float = Field(default=0.2, gt=0)
    poll_max_seconds: float = Field(default=30.0, gt=0)
    # Completion batching: flush after this long or at this many results, whichever comes first.
    flush_interval_seconds: float = Field(default=0.002, ge=0)
    flush_max_batch: int = Field(default=1000, ge=1)
    retry_base_seconds: float = Field(default=1.0, gt=0)
    retry_max_seconds: float = Field(default=24 * 3600.0, gt=0)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_address: str = "0.0.0.0"
    # From the first stop signal to exit: drain, release, flush and deregister share this budget,
    # which must stay below the pod's terminationGracePeriodSeconds. Unset: drain_seconds + 5.
    shutdown_seconds: float | None = Field(default=None, gt=0)
    # A task name no handler is registered for goes back to pending (no attempt consumed) for this
    # long after it was created, since a newer worker may know it (rolling deploys); then it fails.
    unknown_task_grace_seconds: float = Field(default=600.0, ge=0)
    # External commands (--command): environment variables passed through besides a small safe
    # base set (PATH, HOME, LANG, ...); the worker's own DATABASE_URL is not passed unless listed.
    command_env: tuple[str, ...] = ()
    # Bytes read from a command's stdout; past it the attempt fails permanently.
    command_output_limit_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)

    @model_validator(mode="before")
    @classmethod
    def _lease_derived_defaults(cls, values: dict) -> dict:
        lease = float(values.get("lease_seconds", 30.0))
        values = dict(values)
        if values.get("rescue_interval_seconds") is None:
            values["rescue_interval_seconds"] = lease / 4
        if values.get("worker_ttl_seconds") is None:
            values["worker_ttl_seconds"] = lease * 4
        if values.get("shutdown_seconds") is None:
            values["shutdown_seconds"] = float(values.get("drain_seconds", 20.0)) + 5
        return values

    @model_validator(mode="after")
    def _coherent(self) -> WorkerSettings:
        import re

        for queue in self.queues:
            if not re.match(QUEUE_PATTERN, queue):
                raise ValueError(f"invalid queue name {queue!r}: letters, digits, _.:- only, at most 128")
        if not self.queues:
            raise ValueError("at least one queue is needed")
        if self.heartbeat_seconds * 2 > self.lease_seconds:
            raise ValueError(f"heartbeat ({self.heartbeat_seconds}s) must be at most half the lease "
                             f"({self.lease_seconds}s), or leases expire between heartbeats")
        if self.poll_min_seconds > self.poll_max_seconds:
            raise ValueError("poll_min_seconds must not exceed poll_max_seconds")
        return self

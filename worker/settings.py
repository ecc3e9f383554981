"""Worker settings: every default, bound and meaning defined once, on WorkerSettings' fields.

The worker's flags and its QUEUEWORKER_* environment variables are derived from those fields
(SETTING_OPTIONS), so each setting can be given both ways, `--help` shows the model's defaults,
and a bad value fails at start-up with one line that names the flag or variable it came from.
Unset intervals follow the lease and the drain, so changing one of those never leaves the
others incoherent.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from .names import MAX_SECONDS, QueueName

ENV_PREFIX = "QUEUEWORKER_"
HOUR = 3600.0
DAY = 24 * HOUR

Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
EnvVarName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=200)]
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*$")


def _bind_address(text: str) -> str:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        if not _HOSTNAME.match(text):
            raise ValueError("must be an IP address or a host name") from None
    return text


BindAddress = Annotated[str, AfterValidator(_bind_address)]


class WorkerSettings(BaseModel):
    """What a worker process runs with. Numbers are finite and fit the Postgres columns and the
    Python timers they end up in; cross-field rules are checked together."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    queues: tuple[QueueName, ...] = Field(default=("default",), min_length=1, description="queues to work")
    concurrency: int = Field(default=10, ge=1, le=10000, description="attempts run at once")
    lease_seconds: PositiveSeconds = Field(default=30.0, ge=2.0,
                                           description="how long a claim lasts without a heartbeat")
    heartbeat_seconds: PositiveSeconds | None = Field(
        default=None, description="how often leases are extended; unset: a third of the lease")
    drain_seconds: Seconds = Field(default=20.0, description="on SIGTERM, how long running attempts may finish")
    task_timeout_seconds: PositiveSeconds = Field(
        default=1800.0, description="hard deadline per attempt for tasks that set none")
    # Background duties: a SIGKILLed worker's tasks are back in the queue at most lease + 1.2 × lease/4
    # after its last heartbeat (39 s with the defaults; the rescue interval is jittered ±20%).
    rescue_interval_seconds: PositiveSeconds | None = Field(
        default=None, description="how often expired leases are returned to the queue; unset: a quarter of the lease")
    deadline_grace_seconds: Seconds = Field(
        default=60.0, description="how long past its deadline a running task is left to its worker before rescue")
    worker_ttl_seconds: PositiveSeconds | None = Field(
        default=None, description="a worker silent this long is considered dead; unset: four leases")
    # Every way work appears (enqueue, release, rescue, promotion, retry) sends a NOTIFY, so the
    # scheduler's and the fetch loop's own timers are only safety nets: keep them cheap when idle.
    scheduler_max_interval_seconds: PositiveSeconds = Field(
        default=30.0, description="longest wait between promotions of due retries and delayed tasks")
    retention_seconds: Seconds = Field(
        default=7 * DAY, description="finished tasks and their audit rows, finished runs (once none of their "
                                     "tasks remain) and their events, and queue events are deleted after this "
                                     "long; 0 keeps them forever")
    # Longer than any job's period: a watermark that goes makes its job's next run start from nothing.
    watermark_retention_seconds: Seconds = Field(
        default=400 * DAY, description="a watermark not advanced for this long, with no run that advances it "
                                       "running, is deleted (the next run naming it starts from nothing); "
                                       "0 keeps them forever")
    cleaner_interval_seconds: PositiveSeconds = Field(default=300.0, description="how often old history is deleted")
    summary_interval_seconds: PositiveSeconds = Field(
        default=60.0, description="how often a worker that did anything logs a summary line (info level)")
    poll_min_seconds: PositiveSeconds = Field(
        default=0.2, description="first idle poll behind LISTEN/NOTIFY; doubles while nothing is found")
    poll_max_seconds: PositiveSeconds = Field(default=30.0, description="longest idle poll")
    # A PgBouncer in transaction pooling mode delivers no notification: the worker finds that out
    # by itself at start (a notification to itself that never arrives) and polls.
    listen: bool = Field(default=True, description="hear of new tasks, cancellations, queue settings and schedule "
                                                   "changes by LISTEN; when off, or when notifications do not "
                                                   "arrive, poll instead")
    poll_interval_seconds: PositiveSeconds = Field(
        default=1.0, description="without LISTEN, how often to look for tasks, due retries, cancellations "
                                 "and queue settings")
    async_claim_commit: bool = Field(
        default=True, description="commit claims without waiting for the disk (synchronous_commit off for "
                                  "them alone): a claim lost in a Postgres crash puts its task back, and the "
                                  "holder cannot complete it (at-least-once either way; docs/failure-handling.md)")
    prepare_statements: bool = Field(
        default=True, description="prepare repeated statements on the worker's connections (never through a "
                                  "PgBouncer, which the worker recognises; turn off behind another pooler "
                                  "in transaction mode)")
    builtin_tasks: bool = Field(
        default=False, description="register the built-in tasks qw.noop, qw.sleep and qw.fail (demos, smoke tests, "
                                   "benchmarks); off in production, where any producer could enqueue qw.fail to "
                                   "open a queue's breaker or qw.sleep to pin its slots")
    flush_interval_seconds: Seconds = Field(
        default=0.002, description="outcomes are written after this long or at --flush-max-batch, "
                                   "whichever comes first")
    flush_max_batch: int = Field(default=1000, ge=1, le=100_000, description="most outcomes written per statement")
    retry_base_seconds: PositiveSeconds = Field(
        default=1.0, description="backoff after the first failed attempt; doubles per attempt")
    retry_max_seconds: PositiveSeconds = Field(default=24 * HOUR, description="longest backoff")
    metrics_port: int | None = Field(default=None, ge=0, le=65535,
                                     description="serve Prometheus metrics on this port; unset: no metrics")
    metrics_address: BindAddress = Field(default="0.0.0.0", description="address the metrics server binds")
    key_metrics: int = Field(
        default=0, ge=0, le=100, description="export the N keys with the most tasks ready of each keyed queue this "
                                             "worker serves (queueworker_key_tasks{queue,key,state}), read every "
                                             "30 s; 0: no series per key, only aggregates")
    shutdown_seconds: PositiveSeconds | None = Field(
        default=None, description="from the first stop signal to exit: drain, release, flush and deregister "
                                  "share it; keep it below the pod's termination grace period; unset: drain + 5")
    unknown_task_grace_seconds: Seconds = Field(
        default=600.0, description="a task no handler knows goes back to pending (no attempt used) until it is "
                                   "this old, for a newer worker to take; then it fails")
    command_env: tuple[EnvVarName, ...] = Field(
        default=(), description="environment variables passed to --command processes besides a safe base set "
                                "(the worker's DATABASE_URL only when listed)")
    command_output_limit_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, le=2**31 - 1,
        description="bytes read from a command's stdout; past it the attempt fails permanently")

    @model_validator(mode="after")
    def _derived_and_coherent(self) -> WorkerSettings:
        derived = {"heartbeat_seconds": self.lease_seconds / 3, "rescue_interval_seconds": self.lease_seconds / 4,
                   "worker_ttl_seconds": self.lease_seconds * 4, "shutdown_seconds": self.drain_seconds + 5}
        for name, value in derived.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)  # frozen for users; filled in once, here
        if self.heartbeat_seconds * 2 > self.lease_seconds:
            raise ValueError(f"heartbeat ({self.heartbeat_seconds:g}s) must be at most half the lease "
                             f"({self.lease_seconds:g}s), or leases expire between heartbeats")
        if self.poll_min_seconds > self.poll_max_seconds:
            raise ValueError("poll_min_seconds must not exceed poll_max_seconds")
        if self.shutdown_seconds < self.drain_seconds:
            raise ValueError(f"shutdown_seconds ({self.shutdown_seconds:g}) must be at least drain_seconds "
                             f"({self.drain_seconds:g}): the drain is part of the shutdown")
        return self


@dataclass(frozen=True)
class SettingOption:
    """How one WorkerSettings field is given from outside: a flag and an environment variable,
    both in the same unit (`scale` converts it to the field's: hours to seconds)."""

    field: str
    flag: str
    env: str
    scale: float = 1.0

    @property
    def is_list(self) -> bool:
        return isinstance(WorkerSettings.model_fields[self.field].default, tuple)

    @property
    def is_switch(self) -> bool:
        """A true-or-false field: its flag turns it on (`--field`) or, when on by default, off
        (`--no-field`); its variable takes true or false."""
        return isinstance(WorkerSettings.model_fields[self.field].default, bool)

    @property
    def switched_to(self) -> str:
        """What a switch's flag sets the field to."""
        return "false" if WorkerSettings.model_fields[self.field].default is True else "true"

    @property
    def default_text(self) -> str | None:
        """The model's default in this option's unit, for --help; None when derived or off."""
        default = WorkerSettings.model_fields[self.field].default
        if default is None:
            return None
        if isinstance(default, bool):
            return str(default).lower()
        if isinstance(default, tuple):
            return ",".join(default) or "none"
        if isinstance(default, float):
            return f"{default / self.scale:g}"
        return str(default)

    def value(self, given: str | Sequence[str], source: str) -> Any:
        """`given` as the field takes it; pydantic parses the text, except for a scaled unit."""
        if self.scale == 1.0:
            return given
        try:
            number = float(given)  # type: ignore[arg-type]
        except ValueError:
            raise SettingsError(f"{source}: Input should be a valid number") from None
        return number * self.scale


# Fields whose flag predates the derived names (kept stable), and those given in other units.
_NAMED_OPTIONS = {
    "queues": SettingOption("queues", "--queue", f"{ENV_PREFIX}QUEUES"),
    "task_timeout_seconds": SettingOption("task_timeout_seconds", "--task-timeout", f"{ENV_PREFIX}TASK_TIMEOUT"),
    "retention_seconds": SettingOption("retention_seconds", "--retention-hours", f"{ENV_PREFIX}RETENTION_HOURS",
                                       scale=HOUR),
    "watermark_retention_seconds": SettingOption("watermark_retention_seconds", "--watermark-retention-days",
                                                 f"{ENV_PREFIX}WATERMARK_RETENTION_DAYS", scale=DAY),
}


def _derived_option(field: str) -> SettingOption:
    negation = "no-" if WorkerSettings.model_fields[field].default is True else ""
    return SettingOption(field, "--" + negation + field.replace("_", "-"), ENV_PREFIX + field.upper())


SETTING_OPTIONS: tuple[SettingOption, ...] = tuple(
    _NAMED_OPTIONS.get(field) or _derived_option(field) for field in WorkerSettings.model_fields)
"""One option per WorkerSettings field, in field order: flag `--field-name` (`--no-field-name` for
a switch, on by default), variable QUEUEWORKER_FIELD_NAME (the variable follows the flag where an
older flag name is kept)."""


class SettingsError(ValueError):
    """An invalid setting; the message is one line naming the flag or variable it came from."""


def settings_from(flags: Mapping[str, Any], environ: Mapping[str, str]) -> WorkerSettings:
    """WorkerSettings from flags (keyed by field name, None when not given), else from the
    QUEUEWORKER_* variables in `environ` (empty ones count as unset), else the defaults. Lists
    come from repeated flags or comma-separated variables. Raises SettingsError."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for option in SETTING_OPTIONS:
        given = flags.get(option.field)
        if given is not None:
            source = option.flag
        elif environ.get(option.env, "").strip():
            given, source = environ[option.env].strip(), option.env
            if option.is_list:
                given = [item.strip() for item in given.split(",") if item.strip()]
        else:
            continue
        values[option.field] = option.value(given, source)
        sources[option.field] = source if option.scale == 1.0 else f"{source} (as {option.field})"
    try:
        return WorkerSettings(**values)
    except ValidationError as exc:
        raise SettingsError(one_line(exc, sources)) from None


def one_line(exc: ValidationError, labels: Mapping[str, str] | None = None) -> str:
    """The problems in a ValidationError on one line, the first for each field, each named by its
    label (a flag, a variable) or else by the field."""
    problems: dict[str, str] = {}
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        name = (labels or {}).get(field, field)
        message = error["msg"].removeprefix("Value error, ")
        problems.setdefault(field, f"{name}: {message}" if name else message)
    return "; ".join(problems.values())

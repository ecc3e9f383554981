"""Periodic tasks (cron): what a schedule is, checked, and where its slots fall.

A schedule is a row of `queueworker.cron_jobs` (migration 011): a name, a cron expression (five
fields, or six with seconds last), an IANA time zone, a catch-up rule and the task each slot
enqueues. Schedules are declared in code (`periodic`, `@task(cron=...)`: every worker writes them
at start) or at runtime (`queueworker cron add`, or the console). The worker's cron duty
(queueworker.runtime.cron) enqueues each slot exactly once. Runtime schedules are added, listed,
paused, resumed and deleted by the functions at the end of this module, in the caller's transaction.

Time zones and daylight saving time follow croniter: a slot in a gap (02:30 on the night clocks go
forward) runs at the first time that exists after it (03:00); a slot in an overlap (02:30 on the
night clocks go back) runs twice, once per offset. docs/cron.md has the whole story.
"""

from __future__ import annotations

import functools
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

import psycopg
from pydantic import TypeAdapter, ValidationError

# croniter (and dateutil with it) is imported by the functions that work out slots, not here: a
# worker without schedules never needs it, and starts sooner without it.
from ..db import statements
from ..db.cron import (
    CRON_JOB_SOURCE, CRON_JOBS, CRON_SCHEDULE_FOR_UPDATE, DATABASE_NOW, DELETE_CRON_JOB, PAUSE_CRON_JOB,
    RESUME_CRON_JOB, UPSERT_RUNTIME_CRON_JOB, CronJobNameParams, CronJobRow, ResumeCronJobParams, UpsertCronJobParams)
from ..db.statements import NO_PARAMS
from ..names import TaskName
from .producer import TaskSpec

CatchUp = Literal["none", "latest", "all"]
CATCH_UP: tuple[CatchUp, ...] = ("none", "latest", "all")
MAX_EXPRESSION_LENGTH = 200
_JOB_NAME = TypeAdapter(TaskName)
_CATCH_UP = TypeAdapter(CatchUp)


class CronError(ValueError):
    """A schedule that cannot be: a bad expression, time zone, name or catch-up (one line)."""


@functools.lru_cache(maxsize=1)
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones() | {"UTC"})


def zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone `name` (Europe/Berlin, UTC). Only names of the time zone database are
    accepted: ZoneInfo alone would also try paths and files it happens to find."""
    if not isinstance(name, str) or name not in _zone_names():
        raise CronError(f"unknown time zone {str(name)[:100]!r} (an IANA name, e.g. Europe/Berlin or UTC)")
    return zoneinfo.ZoneInfo(name)


def slots_from(expression: str, tz: zoneinfo.ZoneInfo, start: datetime, backwards: bool = False) -> Iterator[datetime]:
    """The expression's slots strictly after (or before) `start`, in order, as UTC times."""
    from croniter import croniter

    times = croniter(expression, start.astimezone(tz))
    step = times.get_prev if backwards else times.get_next
    while True:
        yield step(datetime).astimezone(timezone.utc)


def first_slot_after(expression: str, timezone_name: str, after: datetime) -> datetime:
    """The first slot strictly after `after`; CronError for an expression that is malformed or
    never matches (30 February)."""
    if not isinstance(expression, str) or not 1 <= len(expression) <= MAX_EXPRESSION_LENGTH \
            or not expression.isprintable():
        raise CronError(f"invalid cron expression {str(expression)[:60]!r}: printable text of 1 to "
                        f"{MAX_EXPRESSION_LENGTH} characters")
    tz = zone(timezone_name)
    from croniter import CroniterError, croniter

    try:
        # Five or six fields, or an alias: never croniter's seventh (a year), whose schedules end.
        if not croniter.is_valid(expression) or not (expression.startswith("@") or len(expression.split()) in (5, 6)):
            raise CronError(f"invalid cron expression {expression!r} (five fields: minute hour day month weekday; "
                            "an optional sixth: seconds)")
        return next(slots_from(expression, tz, after))
    except CroniterError as exc:
        raise CronError(f"invalid cron expression {expression!r}: {str(exc).splitlines()[0][:200]}") from None


@dataclass(frozen=True)
class CronJob:
    """One schedule: its name, cron expression, time zone, catch-up rule, and the task each slot
    enqueues (a TaskSpec: task, payload, queue, priority, max_attempts, key)."""

    name: str
    expression: str
    timezone: str
    catch_up: CatchUp
    spec: TaskSpec

    def params(self, first_slot: datetime) -> UpsertCronJobParams:
        """The parameters of cron.sql's upsert_code_cron_job and upsert_runtime_cron_job."""
        return UpsertCronJobParams(name=self.name, expression=self.expression, timezone=self.timezone,
                                   task=self.spec.task, payload=self.spec.payload_json, queue=self.spec.queue,
                                   priority=self.spec.priority, max_attempts=self.spec.max_attempts,
                                   catch_up=self.catch_up, first_slot=first_slot, key=self.spec.key)


def schedule_name(name: str) -> str:
    """A schedule's name, checked: printable text of 1 to 200 characters, as a task's name."""
    try:
        return _JOB_NAME.validate_python(name)
    except ValidationError as exc:
        raise CronError(f"invalid schedule name {str(name)[:60]!r}: {exc.errors()[0]['msg']}") from None


def cron_job(name: str, cron: str, task: str, payload: Any = None, *, queue: str | None = None,
             timezone: str = "UTC", catch_up: str = "none", priority: int | None = None,
             max_attempts: int | None = None, key: str | None = None) -> CronJob:
    """A checked schedule. CronError (a ValueError) for the schedule itself, pydantic's
    ValidationError for the task (as TaskSpec checks it)."""
    name = schedule_name(name)
    try:
        catch_up = _CATCH_UP.validate_python(catch_up)
    except ValidationError:
        raise CronError(f"catch_up must be one of {', '.join(CATCH_UP)}, not {str(catch_up)[:40]!r}") from None
    first_slot_after(cron, timezone, datetime.now().astimezone())  # checks both, says why
    given = {"queue": queue, "priority": priority, "max_attempts": max_attempts, "key": key}
    spec = TaskSpec(task=task, payload={} if payload is None else payload,
                    **{k: v for k, v in given.items() if v is not None})
    return CronJob(name, cron, timezone, catch_up, spec)


class Schedule:
    """The schedules declared in code, by name; every worker writes them to the database at start."""

    def __init__(self) -> None:
        self._jobs: dict[str, CronJob] = {}

    def add(self, job: CronJob) -> CronJob:
        existing = self._jobs.get(job.name)
        if existing is not None and existing != job:
            raise ValueError(f"schedule {job.name!r} is already declared differently: {existing}")
        self._jobs[job.name] = job
        return job

    def jobs(self) -> list[CronJob]:
        return [self._jobs[name] for name in sorted(self._jobs)]


default_schedule = Schedule()


def periodic(name: str, cron: str, task: str, payload: Any = None, *, queue: str | None = None,
             timezone: str = "UTC", catch_up: str = "none", priority: int | None = None,
             max_attempts: int | None = None, key: str | None = None) -> CronJob:
    """Declares a schedule in code: task `task` with `payload` on `queue`, at every slot of the cron
    expression `cron` (five fields, or six with seconds last) in the IANA `timezone`. `catch_up`
    says what happens to slots missed while no worker ran: "none" (skipped), "latest" (the most
    recent one runs) or "all" (each runs, at most queueworker.runtime.cron.MAX_CATCH_UP_SLOTS).
    `key` is the task key of every slot (TaskSpec.key).
    Every worker that imports the declaration writes it to the database at start; a schedule of the
    same name added at runtime (`queueworker cron add`) wins over it."""
    return default_schedule.add(cron_job(name, cron, task, payload, queue=queue, timezone=timezone,
                                         catch_up=catch_up, priority=priority, max_attempts=max_attempts,
                                         key=key))


# -- runtime schedules (`queueworker cron`) ------------------------------------------------------

Added = Literal["added", "replaced", "unchanged"]


def add_schedule(conn: psycopg.Connection, job: CronJob) -> Added:
    """Adds `job` as a runtime schedule, or replaces the runtime schedule of its name; says which
    (unchanged: it was the same already). Its first slot is the first after the database's clock.
    CronError when a schedule declared in code holds the name."""
    now = statements.fetch(conn, DATABASE_NOW, NO_PARAMS)[0].now
    changed = statements.fetch_one(conn, UPSERT_RUNTIME_CRON_JOB,
                                   job.params(first_slot_after(job.expression, job.timezone, now)))
    if changed is not None:
        return "added" if changed.created else "replaced"
    holder = statements.fetch_one(conn, CRON_JOB_SOURCE, CronJobNameParams(name=job.name))
    if holder is not None and holder.source == "code":
        raise CronError(f"schedule {job.name!r} is declared in code: change it there, or give this one another name")
    return "unchanged"


def schedules(conn: psycopg.Connection) -> list[CronJobRow]:
    """Every schedule, declared in code or at runtime, by name."""
    return statements.fetch(conn, CRON_JOBS, NO_PARAMS)


def pause_schedule(conn: psycopg.Connection, name: str) -> None:
    """Enqueues no more slots of the schedule until it is resumed. CronError when there is none of
    that name."""
    if not statements.fetch(conn, PAUSE_CRON_JOB, CronJobNameParams(name=schedule_name(name))):
        raise _no_schedule(name)


def resume_schedule(conn: psycopg.Connection, name: str) -> datetime | None:
    """Goes on from the schedule's first slot after now (slots of the pause are skipped); that slot,
    or None when the schedule was not paused. CronError when there is none of that name, or its
    expression no longer has a slot."""
    params = CronJobNameParams(name=schedule_name(name))
    with conn.transaction():
        schedule = statements.fetch_one(conn, CRON_SCHEDULE_FOR_UPDATE, params)
        if schedule is None:
            raise _no_schedule(name)
        try:
            next_slot = first_slot_after(schedule.expression, schedule.timezone, schedule.now)
        except CronError as exc:
            raise CronError(f"schedule {name!r} cannot be resumed: {exc}") from None
        resumed = statements.fetch(conn, RESUME_CRON_JOB, ResumeCronJobParams(name=name, next_slot=next_slot))
    return next_slot if resumed else None


def delete_schedule(conn: psycopg.Connection, name: str) -> None:
    """Removes the schedule (one declared in code comes back when a worker declaring it starts).
    CronError when there is none of that name."""
    if not statements.fetch(conn, DELETE_CRON_JOB, CronJobNameParams(name=schedule_name(name))):
        raise _no_schedule(name)


def _no_schedule(name: str) -> CronError:
    return CronError(f"no schedule named {name[:200]!r}")

"""Periodic tasks (migration 011): the cron duty (queueworker.runtime.cron) and the runtime schedules of
queueworker.client.cron (`queueworker cron`). The statements are in cron.sql."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from .statements import JsonText, NoParams, Params, SqlFile

_SQL = SqlFile("cron")


class DatabaseNowRow(NamedTuple):
    now: datetime


class UpsertCronJobParams(Params):
    """A schedule as CronJob.params gives it: its first slot is used only when it is new, or its
    expression or time zone changed."""

    name: str
    expression: str
    timezone: str
    task: str
    payload: JsonText
    queue: str
    priority: int
    max_attempts: int
    catch_up: str
    first_slot: datetime
    key: str | None  # the task key of every slot (migration 018)


class UpsertedCronJobRow(NamedTuple):
    created: bool


class RuntimeCronJobsAmongParams(Params):
    names: list[str]


class CronJobNameRow(NamedTuple):
    name: str


class DueCronJobsParams(Params):
    ahead: float
    limit: int
    skipped: list[str]


class DueCronJobRow(NamedTuple):
    name: str
    expression: str
    timezone: str
    catch_up: str
    next_slot: datetime
    now: datetime


class NextCronSlotParams(Params):
    skipped: list[str]


class NextCronSlotRow(NamedTuple):
    next_in: float | None  # None: no schedule is active


class EnqueueCronSlotsParams(Params):
    next_slot: datetime
    last_slot: datetime | None
    name: str
    seen: datetime
    expression: str
    timezone: str
    slots: list[datetime]
    dedupe_keys: list[str]


class EnqueuedSlotsRow(NamedTuple):
    advanced: int
    enqueued: int


class CronJobRow(NamedTuple):
    name: str
    expression: str
    timezone: str
    task: str
    payload_json: str
    queue: str
    priority: int
    max_attempts: int
    catch_up: str
    paused: bool
    source: str
    next_slot: datetime
    last_enqueued_slot: datetime | None
    created_at: datetime
    updated_at: datetime
    key: str | None


class CronJobNameParams(Params):
    name: str


class CronScheduleRow(NamedTuple):
    expression: str
    timezone: str
    now: datetime


class ResumeCronJobParams(Params):
    next_slot: datetime
    name: str


class CronJobSourceRow(NamedTuple):
    source: str


DATABASE_NOW = _SQL.statement("database_now", NoParams, DatabaseNowRow)
UPSERT_CODE_CRON_JOB = _SQL.statement("upsert_code_cron_job", UpsertCronJobParams, UpsertedCronJobRow)
UPSERT_RUNTIME_CRON_JOB = _SQL.statement("upsert_runtime_cron_job", UpsertCronJobParams, UpsertedCronJobRow)
RUNTIME_CRON_JOBS_AMONG = _SQL.statement("runtime_cron_jobs_among", RuntimeCronJobsAmongParams, CronJobNameRow)
DUE_CRON_JOBS = _SQL.statement("due_cron_jobs", DueCronJobsParams, DueCronJobRow)
NEXT_CRON_SLOT_IN = _SQL.statement("next_cron_slot_in", NextCronSlotParams, NextCronSlotRow)
ENQUEUE_CRON_SLOTS = _SQL.statement("enqueue_cron_slots", EnqueueCronSlotsParams, EnqueuedSlotsRow)
CRON_JOBS = _SQL.statement("cron_jobs", NoParams, CronJobRow)
CRON_SCHEDULE_FOR_UPDATE = _SQL.statement("cron_schedule_for_update", CronJobNameParams, CronScheduleRow)
PAUSE_CRON_JOB = _SQL.statement("pause_cron_job", CronJobNameParams, CronJobNameRow)
RESUME_CRON_JOB = _SQL.statement("resume_cron_job", ResumeCronJobParams, CronJobNameRow)
CRON_JOB_SOURCE = _SQL.statement("cron_job_source", CronJobNameParams, CronJobSourceRow)
DELETE_CRON_JOB = _SQL.statement("delete_cron_job", CronJobNameParams, CronJobSourceRow)

_SQL.check_all_declared()

"""The cron duty: each slot of every schedule enqueued exactly once, however many workers run.

Every worker runs it: it reads the schedules due within ENQUEUE_AHEAD_SECONDS, works out their
slots here (croniter, in the schedule's time zone), and enqueues them in the statement that moves
the schedule's `next_slot` on, only if `next_slot` still holds what it read. Of several workers
that see the same slot, one moves it on and enqueues; the others change nothing. No leader, no
lock held between statements. Each slot's task is enqueued as a delayed task due at the slot,
before its time, so the controller's lookahead sees it coming and the scheduler duty admits it on
time. What a schedule is: queueworker.client.cron.

Between passes the duty sleeps until the earliest next slot is due for enqueueing. Every statement
that changes a schedule notifies (queueworker.db.notify.CRON_CHANNEL), and the listener wakes the
duty, so a schedule added or resumed at runtime is seen at once; a worker that listens looks on its
own only every SAFETY_POLL_SECONDS, one that cannot listen every POLL_SECONDS.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import psycopg

from .. import dsn as dsn_text, metrics
from ..client.cron import CronError, Schedule, first_slot_after, slots_from, zone
from ..db.connection import DutyConnection
from ..db.cron import (DATABASE_NOW, DUE_CRON_JOBS, ENQUEUE_CRON_SLOTS, NEXT_CRON_SLOT_IN, RUNTIME_CRON_JOBS_AMONG,
                       UPSERT_CODE_CRON_JOB, DueCronJobRow, DueCronJobsParams, EnqueueCronSlotsParams, NextCronSlotParams,
                       RuntimeCronJobsAmongParams)
from ..db.statements import NO_PARAMS

log = logging.getLogger("queueworker.cron")

# A slot's task is enqueued this long before the slot (a delayed task due at the slot): the
# controller's lookahead counts it, and the scheduler admits it on time. Pausing or deleting a
# schedule leaves the tasks already enqueued for the next minute.
ENQUEUE_AHEAD_SECONDS = 60.0
# A slot the duty first sees more than this long after it was due was missed (the fleet was down,
# or at zero replicas with nothing awake): the schedule's catch_up decides whether it runs.
LATE_AFTER_SECONDS = 60.0
# catch_up="all" enqueues at most this many missed slots of one schedule (the latest ones).
MAX_CATCH_UP_SLOTS = 100
# Slots of one schedule enqueued by one statement; a schedule with more due goes on at once.
MAX_SLOTS_PER_STATEMENT = 1000
# How often a worker that cannot listen (--no-listen, a PgBouncer in transaction pooling mode)
# looks for schedules added or resumed at runtime; also how soon a schedule that cannot be
# computed is looked at again.
POLL_SECONDS = 10.0
# A worker that listens hears of every change at once: it looks on its own this seldom, for
# schedules changed by hand in SQL (which tells no one), and should a listener connection die
# without the worker noticing.
SAFETY_POLL_SECONDS = 300.0
MIN_SLEEP = 0.01
DUE_BATCH = 100

def schedule_fault(exc: psycopg.Error) -> bool:
    """Whether a database error belongs to one schedule (its values, a constraint, a trigger, a
    permission), so the pass goes on with the others; errors of the connection or the server
    (classes 08, 40, 53, 57, 58, XX, or no SQLSTATE) end the pass instead."""
    return exc.sqlstate is not None and exc.sqlstate[:2] not in ("08", "40", "53", "57", "58", "XX")


@dataclass(frozen=True)
class SlotPlan:
    """What one pass does for one schedule: the slots to enqueue now (missed ones first, then those
    due within ENQUEUE_AHEAD_SECONDS), the schedule's next slot after them, and what catch-up left
    out."""

    slots: list[datetime]
    next_slot: datetime
    missed_from: datetime | None  # the missed slots left out lie from here...
    missed_until: datetime | None  # ...to here (None: none left out)
    cut: bool  # catch_up="all" met more than MAX_CATCH_UP_SLOTS missed slots


def plan_slots(expression: str, timezone_name: str, catch_up: str, next_slot: datetime, now: datetime) -> SlotPlan:
    """The slots from `next_slot` (a slot not yet handled) up to `now` + ENQUEUE_AHEAD_SECONDS.

    Slots older than LATE_AFTER_SECONDS were missed: "none" enqueues none of them, "latest" the most
    recent one, "all" up to MAX_CATCH_UP_SLOTS of the most recent ones. Missed slots are found
    walking back from the late mark, so a schedule that stood still for years costs no more than
    one that missed a minute."""
    tz = zone(timezone_name)
    late_mark = now - timedelta(seconds=LATE_AFTER_SECONDS)
    horizon = now + timedelta(seconds=ENQUEUE_AHEAD_SECONDS)
    missed: list[datetime] = []
    missed_from = missed_until = None
    cut = False
    if next_slot < late_mark:
        keep = {"none": 0, "latest": 1, "all": MAX_CATCH_UP_SLOTS}[catch_up]
        back = slots_from(expression, tz, late_mark, backwards=True)
        latest_missed = next(back)
        if latest_missed < next_slot:  # next_slot is no slot of the expression: start afresh
            latest_missed = next_slot
        missed.append(latest_missed)
        while len(missed) <= keep:
            earlier = next(back)
            if earlier < next_slot:
                break
            missed.append(earlier)
        if len(missed) > keep:  # some were left out: from next_slot (the first missed) on
            missed_from, missed_until = next_slot, missed[keep]
            cut = catch_up == "all"
        missed = sorted(missed[:keep])
        forward = slots_from(expression, tz, latest_missed)
    else:
        forward = itertools.chain([next_slot], slots_from(expression, tz, next_slot))
    slots = missed
    upcoming = next(forward)
    while upcoming <= horizon and len(slots) < MAX_SLOTS_PER_STATEMENT:
        slots.append(upcoming)
        upcoming = next(forward)
    return SlotPlan(slots, upcoming, missed_from, missed_until, cut)


def dedupe_key(name: str, slot: datetime) -> str:
    """The key of a slot's task: 'cron:NAME:2026-11-26T20:30:00Z'."""
    return f"cron:{name}:{slot.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%SZ}"


class CronDuty:
    """The worker's cron duty: writes the code's schedules at its first pass, then enqueues due slots.
    `listening` says whether the worker hears of schedule changes (its listener calls `changed`);
    a duty that does not know looks for them every POLL_SECONDS."""

    def __init__(self, conn: DutyConnection, schedule: Schedule, listening: Callable[[], bool] = lambda: False):
        self._conn = conn
        self._schedule = schedule
        self._declared = False
        self._listening = listening
        self.wake = asyncio.Event()
        # Schedules that could not be computed or enqueued, and until when (monotonic) this duty
        # leaves them out: each is looked at again every POLL_SECONDS, the others go on meanwhile.
        self._skipped: dict[str, float] = {}

    def changed(self) -> None:
        """A schedule changed (or may have, unheard): look again now."""
        self.wake.set()

    def _poll_seconds(self) -> float:
        return SAFETY_POLL_SECONDS if self._listening() else POLL_SECONDS

    async def declare(self) -> None:
        """Writes the schedules declared in code. One already added at runtime under the same name is
        left alone (runtime wins, say so); a code schedule whose expression or time zone changed
        starts from its next slot."""
        jobs = self._schedule.jobs()
        if not jobs:
            return
        now = (await self._conn.fetch(DATABASE_NOW, NO_PARAMS))[0].now
        for job in jobs:
            first_slot = first_slot_after(job.expression, job.timezone, now)
            await self._conn.fetch(UPSERT_CODE_CRON_JOB, job.params(first_slot))
        for row in await self._conn.fetch(RUNTIME_CRON_JOBS_AMONG,
                                          RuntimeCronJobsAmongParams(names=[job.name for job in jobs])):
            log.warning("schedule %s was added at runtime: its declaration in code is ignored (`queueworker cron "
                        "delete %s` hands it back to the code)", row.name, row.name, extra={"cron_job": row.name})

    async def enqueue_due(self) -> float:
        """Enqueues the slots of every schedule due within ENQUEUE_AHEAD_SECONDS; returns how long
        to wait until the next one is, at most SAFETY_POLL_SECONDS (POLL_SECONDS when not listening)."""
        now = time.monotonic()
        self._skipped = {name: until for name, until in self._skipped.items() if until > now}
        skipped = sorted(self._skipped)
        due = await self._conn.fetch(DUE_CRON_JOBS, DueCronJobsParams(ahead=ENQUEUE_AHEAD_SECONDS, limit=DUE_BATCH,
                                                                      skipped=skipped))
        if not due:
            next_in = (await self._conn.fetch(NEXT_CRON_SLOT_IN, NextCronSlotParams(skipped=skipped)))[0].next_in
            if next_in is None:
                return self._poll_seconds()
            return min(self._poll_seconds(), max(MIN_SLEEP, next_in - ENQUEUE_AHEAD_SECONDS))
        from croniter import CroniterError

        planned = False
        for job in due:
            try:
                plan = plan_slots(job.expression, job.timezone, job.catch_up, job.next_slot, job.now)
            except (CronError, CroniterError) as exc:  # written by hand into the table: the others go on
                log.error("schedule %s cannot be computed, skipped until fixed: %s", job.name, exc,
                          extra={"cron_job": job.name})
                self._skipped[job.name] = now + POLL_SECONDS
                continue
            try:
                await self._enqueue(job, plan)
            except psycopg.Error as exc:
                if not schedule_fault(exc):
                    raise  # the connection's or the server's: the supervisor retries the pass
                log.error("schedule %s could not be enqueued, skipped for %.0f s: %s", job.name, POLL_SECONDS,
                          dsn_text.explain(exc, None), extra={"cron_job": job.name, "sqlstate": exc.sqlstate})
                self._skipped[job.name] = now + POLL_SECONDS
                continue
            planned = True
        # Look again at once after any progress: the next pass finds what is left, or how long to
        # wait. A schedule that cannot be computed or enqueued is looked at again every POLL_SECONDS.
        return MIN_SLEEP if planned else POLL_SECONDS

    async def _enqueue(self, job: DueCronJobRow, plan: SlotPlan) -> None:
        """Enqueues the planned slots (those after the schedule's last enqueued slot)."""
        result = (await self._conn.fetch(ENQUEUE_CRON_SLOTS, EnqueueCronSlotsParams(
            name=job.name, seen=job.next_slot, expression=job.expression, timezone=job.timezone,
            next_slot=plan.next_slot, last_slot=plan.slots[-1] if plan.slots else None,
            slots=plan.slots, dedupe_keys=[dedupe_key(job.name, slot) for slot in plan.slots])))[0]
        if not result.advanced:
            return  # another worker handled these slots first, or the schedule changed meanwhile
        if result.enqueued:
            metrics.CRON_SLOTS_ENQUEUED.labels(job.name).inc(result.enqueued)
        for slot in plan.slots:
            log.debug("enqueued slot %s of schedule %s", slot.isoformat(), job.name,
                      extra={"cron_job": job.name, "slot": slot.isoformat()})
        if plan.cut:
            log.warning("schedule %s missed more than %d slots: enqueued the latest %d, skipped those from %s to %s",
                        job.name, MAX_CATCH_UP_SLOTS, MAX_CATCH_UP_SLOTS, plan.missed_from.isoformat(),
                        plan.missed_until.isoformat(), extra={"cron_job": job.name})
        elif plan.missed_from is not None:
            log.info("schedule %s skipped the slots it missed from %s to %s (catch_up %s)", job.name,
                     plan.missed_from.isoformat(), plan.missed_until.isoformat(), job.catch_up,
                     extra={"cron_job": job.name})

    async def step(self) -> float:
        """One pass of the duty."""
        if not self._declared:
            await self.declare()
            self._declared = True
        return await self.enqueue_due()

"""Periodic tasks (worker/runtime/cron.py): slot computation, catch-up, time zones and daylight saving
time (unit tier); each slot enqueued exactly once by concurrent duties and by real worker
processes, one of them SIGKILLed and restarted; the CLI; the controller's lookahead (integration)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest

from prometheus_client import REGISTRY

from queueworker import cli

from queueworker.runtime import cron

from queueworker.db import statements
from queueworker.db.cron import DUE_CRON_JOBS, ENQUEUE_CRON_SLOTS, DueCronJobsParams, EnqueueCronSlotsParams
from queueworker.db.depth import QUEUE_DEPTH, QueueDepthParams
from queueworker.client.cron import CronError, Schedule, cron_job, first_slot_after
from queueworker.runtime.cron import ENQUEUE_AHEAD_SECONDS, MAX_CATCH_UP_SLOTS, POLL_SECONDS, CronDuty, dedupe_key, plan_slots
from queueworker.db.connection import DutyConnection
from queueworker.settings import WorkerSettings
from queueworker.runtime.worker import Worker
from tests.support import WatchedDuty, WorkerProcess, builtin_registry, query, scalar, start_listening, wait_until

UTC = timezone.utc
COUNTER = "queueworker_cron_slots_enqueued_total"
NOW = datetime(2026, 11, 26, 12, 0, 30, tzinfo=UTC)


def _minutes(start: datetime, count: int) -> list[datetime]:
    return [start + timedelta(minutes=i) for i in range(count)]


# -- unit: slots ------------------------------------------------------------------------------

def test_slots_within_the_horizon_are_planned_and_the_next_one_is_kept():
    plan = plan_slots("* * * * *", "UTC", "none", datetime(2026, 11, 26, 12, 1, tzinfo=UTC), NOW)
    assert plan.slots == [datetime(2026, 11, 26, 12, 1, tzinfo=UTC)]
    assert plan.next_slot == datetime(2026, 11, 26, 12, 2, tzinfo=UTC)
    assert plan.missed_from is None and not plan.cut
    # Not yet within the horizon: nothing to do, the next slot stays.
    later = datetime(2026, 11, 26, 12, 5, tzinfo=UTC)
    assert plan_slots("*/5 * * * *", "UTC", "none", later, NOW).slots == []
    assert plan_slots("*/5 * * * *", "UTC", "none", later, NOW).next_slot == later


def test_a_slot_a_little_late_still_runs_whatever_the_catch_up():
    slot = NOW - timedelta(seconds=30)  # late, but less than LATE_AFTER_SECONDS
    plan = plan_slots("* * * * * */30", "UTC", "none", slot, NOW)
    assert plan.slots[0] == slot and plan.missed_from is None


@pytest.mark.parametrize("catch_up, expected", [
    ("none", []),
    ("latest", [datetime(2026, 11, 26, 11, 59, tzinfo=UTC)]),
    ("all", _minutes(datetime(2026, 11, 26, 11, 50, tzinfo=UTC), 10)),
])
def test_missed_slots_follow_catch_up(catch_up, expected):
    plan = plan_slots("* * * * *", "UTC", catch_up, datetime(2026, 11, 26, 11, 50, tzinfo=UTC), NOW)
    on_time = [datetime(2026, 11, 26, 12, 0, tzinfo=UTC), datetime(2026, 11, 26, 12, 1, tzinfo=UTC)]
    assert plan.slots == expected + on_time
    assert plan.next_slot == datetime(2026, 11, 26, 12, 2, tzinfo=UTC)
    assert (plan.missed_from is None) == (catch_up == "all")
    assert not plan.cut


def test_catch_up_all_is_bounded_to_the_latest_slots_and_says_so():
    start = datetime(2020, 1, 1, tzinfo=UTC)  # years of one slot a second
    plan = plan_slots("* * * * * *", "UTC", "all", start, NOW)
    missed = [s for s in plan.slots if s < NOW - timedelta(seconds=60)]
    assert len(missed) == MAX_CATCH_UP_SLOTS
    assert missed[-1] == NOW.replace(microsecond=0) - timedelta(seconds=61)
    assert missed == sorted(missed) and len(set(plan.slots)) == len(plan.slots)
    assert plan.cut and plan.missed_from == start and plan.missed_until == missed[0] - timedelta(seconds=1)
    assert plan.slots[-1] <= NOW + timedelta(seconds=ENQUEUE_AHEAD_SECONDS) < plan.next_slot


def _walk(expression: str, tz: str, start: datetime, until: datetime) -> list[datetime]:
    """Every slot handed out by successive passes from `start`, the next slot stored in between (as
    the database stores it: a UTC instant)."""
    slots: list[datetime] = []
    next_slot, now = first_slot_after(expression, tz, start), start
    while now < until:
        plan = plan_slots(expression, tz, "none", next_slot, now)
        slots += plan.slots
        next_slot, now = plan.next_slot.astimezone(UTC), now + timedelta(seconds=45)
    return slots


def test_dst_spring_forward_runs_a_slot_in_the_gap_at_the_first_time_that_exists():
    slots = _walk("30 2 * * *", "Europe/Berlin", datetime(2026, 3, 27, 12, tzinfo=UTC), datetime(2026, 3, 31, tzinfo=UTC))
    assert slots == [datetime(2026, 3, 28, 1, 30, tzinfo=UTC),   # 02:30 CET
                     datetime(2026, 3, 29, 1, 0, tzinfo=UTC),    # 02:30 does not exist: 03:00 CEST
                     datetime(2026, 3, 30, 0, 30, tzinfo=UTC)]   # 02:30 CEST


def test_dst_fall_back_runs_a_slot_in_the_overlap_once_per_offset():
    slots = _walk("30 2 * * *", "Europe/Berlin", datetime(2026, 10, 24, 12, tzinfo=UTC),
                  datetime(2026, 10, 26, 12, tzinfo=UTC))
    assert slots == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST
                     datetime(2026, 10, 25, 1, 30, tzinfo=UTC),  # 02:30 CET, the hour again
                     datetime(2026, 10, 26, 1, 30, tzinfo=UTC)]
    hourly = _walk("0 * * * *", "Europe/Berlin", datetime(2026, 10, 24, 22, 30, tzinfo=UTC),
                   datetime(2026, 10, 25, 3, 30, tzinfo=UTC))
    assert hourly == [datetime(2026, 10, 24, 23, tzinfo=UTC) + timedelta(hours=i) for i in range(5)]


@pytest.mark.parametrize("expression, tz, message", [
    ("not cron", "UTC", "invalid cron expression"),
    ("61 * * * *", "UTC", "invalid cron expression"),
    ("0 0 30 2 *", "UTC", "invalid cron expression"),  # 30 February: valid fields, never a slot
    ("0 0 1 1 * 0 2027", "UTC", "invalid cron expression"),  # a year: a schedule that ends
    ("@reboot", "UTC", "invalid cron expression"),
    ("*/0 * * * *", "UTC", "invalid cron expression"),
    ("1-100000000 * * * *", "UTC", "invalid cron expression"),
    ("* * * *\x00 *", "UTC", "printable"),
    ("* " * 200, "UTC", "printable text of 1 to 200"),
    ("", "UTC", "printable text of 1 to 200"),
    ("* * * * *", "Mars/Olympus", "unknown time zone"),
    ("* * * * *", "../../etc/passwd", "unknown time zone"),
    ("* * * * *", "Europe/Berlin\x00", "unknown time zone"),
])
def test_bad_schedules_are_refused_with_one_line(expression, tz, message):
    with pytest.raises(CronError, match=message) as raised:
        first_slot_after(expression, tz, NOW)
    assert "\n" not in str(raised.value)


def test_declarations_are_checked_and_a_name_is_declared_once():
    schedule = Schedule()
    job = schedule.add(cron_job("report", "0 6 * * 1", "reports.weekly", {"k": 1}, timezone="Europe/Berlin"))
    assert schedule.add(cron_job("report", "0 6 * * 1", "reports.weekly", {"k": 1}, timezone="Europe/Berlin")) == job
    with pytest.raises(ValueError, match="already declared differently"):
        schedule.add(cron_job("report", "0 7 * * 1", "reports.weekly", {"k": 1}))
    with pytest.raises(CronError, match="catch_up must be one of"):
        cron_job("x", "* * * * *", "t", catch_up="some")
    with pytest.raises(CronError, match="invalid schedule name"):
        cron_job("bad\nname", "* * * * *", "t")
    with pytest.raises(ValueError, match="cannot be stored"):
        cron_job("x", "* * * * *", "t", {"n": float("nan")})


def test_task_decorator_with_cron_declares_a_schedule_of_the_task():
    from queueworker.client.cron import default_schedule
    from queueworker.runtime.handlers import task

    @task(name="tests.cron.decorated", cron="*/5 * * * *", timezone="Europe/Berlin", catch_up="latest")
    def decorated(payload):
        return payload

    (job,) = [j for j in default_schedule.jobs() if j.name == "tests.cron.decorated"]
    assert (job.expression, job.timezone, job.catch_up, job.spec.task) == (
        "*/5 * * * *", "Europe/Berlin", "latest", "tests.cron.decorated")


def test_aliases_are_schedules_too():
    assert first_slot_after("@hourly", "UTC", NOW) == datetime(2026, 11, 26, 13, tzinfo=UTC)


def test_dedupe_key_names_the_slot_in_utc():
    slot = datetime(2026, 11, 26, 21, 30, tzinfo=timezone(timedelta(hours=1)))
    assert dedupe_key("nightly", slot) == "cron:nightly:2026-11-26T20:30:00Z"


# -- integration ------------------------------------------------------------------------------

def _cli(dsn: str, *args: str) -> int:
    return cli.main(["cron", args[0], "--dsn", dsn, *args[1:]])


def _slot_tasks(dsn: str, name: str) -> list[tuple]:
    """(dedupe key, task count, run_after) per slot of a schedule, every task ever enqueued for it."""
    return query(dsn, """SELECT dedupe_key, count(*), min(run_after) FROM queueworker.tasks
                         WHERE dedupe_key LIKE %s GROUP BY dedupe_key ORDER BY min(run_after)""", (f"cron:{name}:%",))


def _set_next_slot(dsn: str, name: str, ago: str, unit: str = "minute") -> datetime:
    return scalar(dsn, "UPDATE queueworker.cron_jobs SET next_slot = date_trunc(%s, now() - %s::interval) "
                       "WHERE name = %s RETURNING next_slot", (unit, ago, name))


def _duties(dsn: str, count: int, schedule: Schedule | None = None) -> list[tuple[CronDuty, DutyConnection]]:
    conns = [DutyConnection(dsn, f"test-cron-{i}") for i in range(count)]
    return [(CronDuty(conn, schedule or Schedule()), conn) for conn in conns]


@pytest.mark.integration
def test_concurrent_duties_enqueue_each_slot_of_a_backlog_exactly_once(dsn):
    """Twelve duties, each on its own connection, race for the same schedules at the same moment:
    a backlog of 90 missed minutes (catch_up all) and one slot a second."""
    assert _cli(dsn, "add", "backlog", "--cron", "* * * * *", "--task", "qw.noop", "--catch-up", "all") == 0
    assert _cli(dsn, "add", "seconds", "--cron", "* * * * * *", "--task", "qw.noop") == 0
    start = _set_next_slot(dsn, "backlog", "90 minutes")
    counted_before = REGISTRY.get_sample_value(COUNTER, {"job": "backlog"}) or 0.0

    async def race() -> None:
        duties = _duties(dsn, 12)
        try:
            for _ in range(3):
                await asyncio.gather(*(duty.enqueue_due() for duty, _ in duties))
        finally:
            for _, conn in duties:
                await conn.close()

    asyncio.run(race())
    backlog = _slot_tasks(dsn, "backlog")
    assert all(count == 1 for _, count, _ in backlog), [row for row in backlog if row[1] != 1]
    slots = [run_after for _, _, run_after in backlog]
    assert slots[0] == start and slots == [start + timedelta(minutes=i) for i in range(len(slots))]
    assert len(slots) >= 91  # the 90 missed minutes and the next one, due within the horizon
    assert REGISTRY.get_sample_value(COUNTER, {"job": "backlog"}) - counted_before == len(slots)
    seconds = _slot_tasks(dsn, "seconds")
    assert all(count == 1 for _, count, _ in seconds)
    assert len(seconds) >= ENQUEUE_AHEAD_SECONDS  # a minute of slots, enqueued ahead
    (next_slot, last) = query(dsn, "SELECT next_slot, last_enqueued_slot FROM queueworker.cron_jobs "
                                   "WHERE name = 'backlog'")[0]
    assert last == slots[-1] and next_slot == last + timedelta(minutes=1)


@pytest.mark.integration
def test_a_pass_that_read_a_slot_another_worker_has_enqueued_and_run_since_changes_nothing(dsn):
    """The compare-and-set, alone: the dedupe key no longer guards a slot whose task finished, so
    only next_slot stops a worker that read the schedule before another one moved it on."""
    assert _cli(dsn, "add", "job", "--cron", "* * * * *", "--task", "qw.noop", "--catch-up", "all") == 0
    _set_next_slot(dsn, "job", "5 minutes")

    async def stale_pass() -> tuple[int, int]:
        (slow, slow_conn), (fast, fast_conn) = _duties(dsn, 2)
        try:
            (job,) = await slow_conn.fetch(DUE_CRON_JOBS, DueCronJobsParams(ahead=ENQUEUE_AHEAD_SECONDS, limit=10,
                                                                                 skipped=[]))
            plan = plan_slots(job.expression, job.timezone, job.catch_up, job.next_slot, job.now)
            await fast.enqueue_due()
            finished = scalar(dsn, "WITH f AS (UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() "
                                   "WHERE dedupe_key LIKE 'cron:job:%%' RETURNING 1) SELECT count(*) FROM f")
            (outcome,) = await slow_conn.fetch(ENQUEUE_CRON_SLOTS, EnqueueCronSlotsParams(
                name=job.name, seen=job.next_slot, expression=job.expression, timezone=job.timezone,
                next_slot=plan.next_slot, last_slot=plan.slots[-1], slots=plan.slots,
                dedupe_keys=[dedupe_key(job.name, slot) for slot in plan.slots]))
            return finished, outcome.advanced + outcome.enqueued
        finally:
            await slow_conn.close()
            await fast_conn.close()

    finished, changed = asyncio.run(stale_pass())
    assert finished >= 6 and changed == 0
    assert all(count == 1 for _, count, _ in _slot_tasks(dsn, "job"))


async def _one_pass(dsn: str) -> None:
    ((duty, conn),) = _duties(dsn, 1)
    try:
        await duty.enqueue_due()
    finally:
        await conn.close()


@pytest.mark.integration
@pytest.mark.parametrize("catch_up", ["none", "latest", "all"])
def test_catch_up_after_downtime(dsn, catch_up, caplog):
    """An hourly schedule that stood still for 150 hours."""
    caplog.set_level(logging.DEBUG, logger="queueworker.cron")
    assert _cli(dsn, "add", "job", "--cron", "0 * * * *", "--task", "qw.noop", "--catch-up", catch_up) == 0
    start = _set_next_slot(dsn, "job", "150 hours", unit="hour")
    asyncio.run(_one_pass(dsn))
    # Missed: older than a minute when the pass enqueued them (the tasks' created_at).
    rows = query(dsn, """SELECT run_after, run_after < created_at - interval '60 seconds' FROM queueworker.tasks
                         WHERE dedupe_key LIKE 'cron:job:%%' ORDER BY run_after""")
    slots = [slot for slot, _ in rows]
    missed = [slot for slot, was_missed in rows if was_missed]
    assert len(missed) == {"none": 0, "latest": 1, "all": MAX_CATCH_UP_SLOTS}[catch_up]
    assert slots == [slots[0] + timedelta(hours=i) for i in range(len(slots))] if slots else catch_up == "none"
    assert scalar(dsn, "SELECT next_slot > now() FROM queueworker.cron_jobs WHERE name = 'job'")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and r.name == "queueworker.cron"] == [
        f"enqueued slot {slot.astimezone(UTC).isoformat()} of schedule job" for slot in slots]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "queueworker.cron"]
    if catch_up == "all":
        assert warnings == [f"schedule job missed more than {MAX_CATCH_UP_SLOTS} slots: enqueued the latest "
                            f"{MAX_CATCH_UP_SLOTS}, skipped those from {start.isoformat()} to "
                            f"{(missed[0] - timedelta(hours=1)).isoformat()}"]
    else:
        assert not warnings
        assert any("skipped the slots it missed" in r.getMessage() for r in caplog.records)


@pytest.mark.integration
def test_slots_enqueued_ahead_are_counted_by_the_controllers_lookahead(dsn):
    assert _cli(dsn, "add", "soon", "--cron", "* * * * *", "--task", "qw.noop", "--queue", "cron-soon") == 0
    asyncio.run(_one_pass(dsn))  # the next minute is always within the minute ahead
    assert all(count == 1 for _, count, _ in _slot_tasks(dsn, "soon"))
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.namedtuple_row) as cursor:
        depth = statements.fetch(conn, QUEUE_DEPTH, QueueDepthParams(queues=["cron-soon"], lookaheads=[120.0], cap=1000,
                                                                     throughput=False))[0]
        delayed = cursor.execute("SELECT count(*) AS n FROM queueworker.tasks WHERE queue = 'cron-soon' "
                                 "AND state = 'pending' AND delayed").fetchone().n
    assert delayed >= 1, "the next slot waits as a delayed task"
    assert depth.due_soon == delayed  # not runnable yet, but seen coming


async def _passes_with_good_paused(dsn: str) -> float:
    """A pass, then schedule 'good' paused, then another pass: what the second has left is a bad
    schedule, which must not make the duty spin. Returns the second pass's wait."""
    ((duty, conn),) = _duties(dsn, 1)
    try:
        await duty.enqueue_due()
        query(dsn, "UPDATE queueworker.cron_jobs SET paused = true WHERE name = 'good' RETURNING 1")
        return await duty.enqueue_due()
    finally:
        await conn.close()


@pytest.mark.integration
def test_a_schedule_that_cannot_be_computed_is_skipped_and_the_others_go_on(dsn, caplog):
    caplog.set_level(logging.ERROR, logger="queueworker.cron")
    assert _cli(dsn, "add", "good", "--cron", "* * * * *", "--task", "qw.noop") == 0
    query(dsn, "INSERT INTO queueworker.cron_jobs (name, expression, task, source, next_slot) "
               "VALUES ('broken', 'every tuesday', 'qw.noop', 'runtime', now() - interval '1 hour') RETURNING 1")

    assert asyncio.run(_passes_with_good_paused(dsn)) == POLL_SECONDS  # the broken one alone is left: no busy loop
    assert len(_slot_tasks(dsn, "good")) >= 1 and _slot_tasks(dsn, "broken") == []
    assert [r.getMessage() for r in caplog.records][0].startswith(
        "schedule broken cannot be computed, skipped until fixed: Exactly 5, 6 or 7 columns")


@pytest.mark.integration
def test_a_schedule_the_database_refuses_is_skipped_and_the_others_go_on(dsn, caplog):
    """A schedule whose enqueue fails in the database (here a trigger of the operator's refuses its
    queue) is logged and left out for POLL_SECONDS; the pass enqueues the others."""
    caplog.set_level(logging.ERROR, logger="queueworker.cron")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""CREATE FUNCTION public.refuse_poisoned() RETURNS trigger LANGUAGE plpgsql AS $$
                        BEGIN IF NEW.queue = 'poisoned' THEN RAISE EXCEPTION 'no tasks in poisoned'; END IF;
                        RETURN NEW; END $$""")
        conn.execute("CREATE TRIGGER refuse_poisoned BEFORE INSERT ON queueworker.tasks "
                     "FOR EACH ROW EXECUTE FUNCTION public.refuse_poisoned()")
    assert _cli(dsn, "add", "bad", "--cron", "* * * * *", "--task", "qw.noop", "--queue", "poisoned") == 0
    assert _cli(dsn, "add", "good", "--cron", "* * * * *", "--task", "qw.noop") == 0
    _set_next_slot(dsn, "bad", "2 minutes")  # due first: it heads every batch

    assert asyncio.run(_passes_with_good_paused(dsn)) == POLL_SECONDS  # the bad one alone is left, and skipped: no busy loop
    assert len(_slot_tasks(dsn, "good")) >= 1 and _slot_tasks(dsn, "bad") == []
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"schedule bad could not be enqueued, skipped for {POLL_SECONDS:.0f} s: no tasks in poisoned")


@pytest.mark.integration
def test_a_slot_is_never_enqueued_twice_when_expression_and_queue_change_together(dsn):
    assert _cli(dsn, "add", "moving", "--cron", "* * * * *", "--task", "qw.noop", "--queue", "first") == 0
    asyncio.run(_one_pass(dsn))  # the next minute's slot, in queue first
    (enqueued,) = [run_after for _, _, run_after in _slot_tasks(dsn, "moving")]
    assert _cli(dsn, "add", "moving", "--cron", "*/1 * * * *", "--task", "qw.noop", "--queue", "second") == 0
    # The new expression starts from its first slot after now: the slot already enqueued (pinned, in
    # case a minute boundary passed meanwhile). Its key, unique per queue, would not stop it in queue second.
    query(dsn, "UPDATE queueworker.cron_jobs SET next_slot = %s WHERE name = 'moving' RETURNING 1", (enqueued,))
    asyncio.run(_one_pass(dsn))
    assert query(dsn, "SELECT queue, count(*) FROM queueworker.tasks WHERE run_after = %s GROUP BY queue",
                 (enqueued,)) == [("first", 1)]
    assert scalar(dsn, "SELECT next_slot > %s FROM queueworker.cron_jobs WHERE name = 'moving'", (enqueued,))


@pytest.mark.integration
def test_code_schedules_are_written_at_start_and_never_overwrite_a_runtime_one(dsn, caplog):
    caplog.set_level(logging.WARNING, logger="queueworker.cron")
    assert _cli(dsn, "add", "shared", "--cron", "0 * * * *", "--task", "runtime.task") == 0
    schedule = Schedule()
    schedule.add(cron_job("shared", "*/5 * * * *", "code.task"))
    schedule.add(cron_job("mine", "*/5 * * * *", "code.task", {"a": 1}, timezone="Europe/Berlin", catch_up="all"))

    async def declare(schedule: Schedule) -> None:
        ((duty, conn),) = _duties(dsn, 1, schedule)
        try:
            await duty.declare()
        finally:
            await conn.close()

    asyncio.run(declare(schedule))
    rows = {r[0]: r[1:] for r in query(dsn, "SELECT name, expression, task, source, timezone, catch_up, payload, "
                                            "next_slot FROM queueworker.cron_jobs")}
    assert rows["shared"][:3] == ("0 * * * *", "runtime.task", "runtime")
    assert rows["mine"][:6] == ("*/5 * * * *", "code.task", "code", "Europe/Berlin", "all", {"a": 1})
    assert any("schedule shared was added at runtime" in r.getMessage() for r in caplog.records)
    # A restart with the same declaration changes nothing; a changed expression starts afresh.
    asyncio.run(declare(schedule))
    assert scalar(dsn, "SELECT next_slot FROM queueworker.cron_jobs WHERE name = 'mine'") == rows["mine"][6]
    changed = Schedule()
    changed.add(cron_job("mine", "0 3 * * *", "code.task", {"a": 1}, timezone="Europe/Berlin"))
    asyncio.run(declare(changed))
    next_slot = scalar(dsn, "SELECT next_slot FROM queueworker.cron_jobs WHERE name = 'mine'")
    assert next_slot.astimezone(ZoneInfo("Europe/Berlin")).hour == 3
    # The runtime add of a name declared in code is refused.
    assert _cli(dsn, "add", "mine", "--cron", "* * * * *", "--task", "t") == 2


@pytest.mark.integration
def test_cli_round_trip_and_bad_input(dsn, capsys):
    assert _cli(dsn, "add", "nightly", "--cron", "30 2 * * *", "--task", "reports.nightly", "--payload",
                '{"full": true}', "--queue", "reports", "--timezone", "Europe/Berlin", "--catch-up", "latest",
                "--priority", "5", "--max-attempts", "3") == 0
    assert capsys.readouterr().out == "schedule nightly: added\n"
    assert _cli(dsn, "list", "--json") == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert {k: listed[k] for k in ("name", "expression", "timezone", "task", "payload", "queue", "priority",
                                   "max_attempts", "catch_up", "paused", "source")} == {
        "name": "nightly", "expression": "30 2 * * *", "timezone": "Europe/Berlin", "task": "reports.nightly",
        "payload": {"full": True}, "queue": "reports", "priority": 5, "max_attempts": 3, "catch_up": "latest",
        "paused": False, "source": "runtime"}
    assert _cli(dsn, "list") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("NAME") and table[1].startswith("nightly") and "active" in table[1]
    before = query(dsn, "SELECT * FROM queueworker.cron_jobs")
    bad = [
        (["add", "x", "--cron", "99 * * * *", "--task", "t"], "invalid cron expression '99 * * * *'"),
        (["add", "x", "--cron", "* * * * *", "--task", "t", "--timezone", "Nowhere/City"], "unknown time zone"),
        (["add", "x", "--cron", "* * * * *", "--task", "t", "--payload", "{bad"], "--payload"),
        (["add", "x", "--cron", "* * * * *", "--task", "t", "--max-attempts", "0"], "--max-attempts"),
        (["add", "x", "--cron", "* * * * *", "--task", "t", "--queue", "bad queue"], "--queue"),
        (["add", "x", "--cron", "* * * * *", "--task", "t\x00"], "--task"),
        (["add", "x\x00", "--cron", "* * * * *", "--task", "t"], "invalid schedule name"),
        (["add", "x", "--cron", "* * * * *", "--task", "t", "--priority", "NaN"], "--priority"),
        (["add", "x", "--cron", "* * * * *", "--task", "t", "--payload", '{"a": NaN}'], "payload cannot be stored"),
        (["add", "nightly", "--cron", "0 0 31 2 *", "--task", "t"], "invalid cron expression"),
        (["pause", "unknown"], "no schedule named 'unknown'"),
        (["resume", "unknown"], "no schedule named 'unknown'"),
        (["delete", "unknown"], "no schedule named 'unknown'"),
        (["pause", "nul\x00"], "invalid schedule name"),
    ]
    for args, message in bad:
        assert _cli(dsn, *args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("queueworker: ") and message in err and err.count("\n") == 1, (args, err)
    assert query(dsn, "SELECT * FROM queueworker.cron_jobs") == before
    with pytest.raises(SystemExit) as usage:
        _cli(dsn, "add", "x", "--cron", "* * * * *", "--task", "t", "--catch-up", "sometimes")
    assert usage.value.code == 2
    capsys.readouterr()

    assert _cli(dsn, "pause", "nightly") == 0
    assert scalar(dsn, "SELECT paused FROM queueworker.cron_jobs WHERE name = 'nightly'")
    _set_next_slot(dsn, "nightly", "3 days")
    assert _cli(dsn, "resume", "nightly") == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("schedule nightly: resumed, next slot ")
    paused, next_slot = query(dsn, "SELECT paused, next_slot > now() FROM queueworker.cron_jobs "
                                   "WHERE name = 'nightly'")[0]
    assert (paused, next_slot) == (False, True)  # the paused days are not caught up
    assert _cli(dsn, "resume", "nightly") == 0
    assert capsys.readouterr().out == "schedule nightly: not paused, nothing changed\n"
    assert _cli(dsn, "add", "nightly", "--cron", "45 2 * * *", "--task", "reports.nightly") == 0
    assert capsys.readouterr().out == "schedule nightly: replaced\n"
    assert _cli(dsn, "delete", "nightly") == 0
    assert scalar(dsn, "SELECT count(*) FROM queueworker.cron_jobs") == 0


@pytest.mark.integration
def test_runtime_changes_reach_a_running_workers_cron_duty_by_notification(dsn, monkeypatch):
    """A running worker's cron duty with nothing to enqueue sleeps for its safety poll, ten years
    here: only the notification that `cron add`, `pause`, `resume` and `delete` send can wake it.
    Each change is followed by a pass that sees it: the sleep it plans is the yearly schedule's
    (until a minute before its next slot) while that schedule is active, the safety poll while it
    is not; a schedule added for every minute has its next slot enqueued."""
    safety = 10 * 365 * 86400.0
    monkeypatch.setattr(cron, "SAFETY_POLL_SECONDS", safety)

    async def change(*args: str) -> None:
        assert await asyncio.to_thread(_cli, dsn, *args) == 0, args

    async def scenario() -> int:
        worker = Worker(dsn, WorkerSettings(), builtin_registry(), schedule=Schedule())
        duty = WatchedDuty(worker, "cron", worker.cron.wake)
        running = await start_listening(worker, duty)
        try:
            assert duty.delays[-1] == safety  # no schedule yet
            for args, active in ((("add", "yearly", "--cron", "0 0 1 1 *", "--task", "qw.noop"), True),
                                 (("pause", "yearly"), False),
                                 (("resume", "yearly"), True),
                                 (("delete", "yearly"), False)):
                ended = len(duty.delays)
                await change(*args)
                delay = await duty.next_delay(ended)
                assert (delay < safety - 86400) if active else (delay == safety), (args, delay)
            await change("add", "minutely", "--cron", "* * * * *", "--task", "qw.noop", "--queue", "cron-none")
            await asyncio.to_thread(wait_until, lambda: _slot_tasks(dsn, "minutely"), 60,
                                    message="the new schedule's next slot enqueued")
        finally:
            worker.request_stop()
        return await running

    assert asyncio.run(scenario()) == 0


@pytest.mark.integration
def test_worker_processes_enqueue_each_slot_exactly_once_across_a_sigkill(dsn):
    """Three `queueworker worker` processes declare the same code schedules (one slot a second, and
    one a minute), and a runtime schedule has 90 missed minutes to catch up. One worker is
    SIGKILLed midway and started again. Every slot from the first to the last is enqueued and
    run exactly once."""
    assert _cli(dsn, "add", "backlog", "--cron", "* * * * *", "--task", "qw.noop", "--catch-up", "all") == 0
    start = _set_next_slot(dsn, "backlog", "90 minutes")
    args = ("--handlers", "tests.cron_handlers", "--concurrency", "4", "--log-level", "debug")
    procs = [WorkerProcess(dsn, *args) for _ in range(3)]
    try:
        wait_until(lambda: len(_slot_tasks(dsn, "backlog")) >= 91, timeout=90, message="the backlog enqueued")
        wait_until(lambda: len(_slot_tasks(dsn, "cron.tick")) >= 30, timeout=90, message="tick slots enqueued")
        procs[0].signal(signal.SIGKILL)
        procs[0].wait(30)
        killed_at = scalar(dsn, "SELECT now()")
        procs[0] = WorkerProcess(dsn, *args)
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE task = 'cron.tick' "
                                       "AND state = 'succeeded' AND run_after > %s + interval '10 seconds'",
                                  (killed_at,)) >= 5, timeout=120, message="ticks run after the restart")
        for proc in procs:
            proc.signal(signal.SIGTERM)
        assert all(proc.wait(60) == 0 for proc in procs), [proc.log()[-3000:] for proc in procs]
    finally:
        for proc in procs:
            proc.stop()
    for name, step in (("backlog", timedelta(minutes=1)), ("cron.tick", timedelta(seconds=1)),
                       ("cron.code-minutely", timedelta(minutes=1))):
        rows = _slot_tasks(dsn, name)
        assert rows and all(count == 1 for _, count, _ in rows), (name, [r for r in rows if r[1] != 1])
        slots = [run_after for _, _, run_after in rows]
        assert slots == [slots[0] + step * i for i in range(len(slots))], f"{name}: a slot is missing"
    assert _slot_tasks(dsn, "backlog")[0][2] == start
    # The code's handler ran the ticks that came due, each slot's task once.
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE task = 'cron.tick' AND state = 'succeeded'") >= 10

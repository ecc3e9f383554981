"""Flow control per queue: pause and resume, a token-bucket rate limit, a global cap on running tasks
and a circuit breaker, enforced inside the claim statement under concurrent workers."""

from __future__ import annotations

import asyncio
import bisect
import math
import time
import urllib.request
import uuid

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from queueworker import enqueue_many

from queueworker.runtime import flow

from queueworker.client import operations

from queueworker.db import statements
from queueworker.db.connection import DutyConnection
from queueworker.db.flow import RECORD_BREAKER, RecordBreakerParams
from queueworker.db.lease import CLAIM, CLAIM_LIMITED, LOCK_QUEUE, ClaimParams, LockQueueParams
from queueworker.db.statements import Bound, Statement
from queueworker.dev.localpg import free_port
from queueworker.runtime.flow import REFRESH_SECONDS
from queueworker.client.operations import parse_duration, parse_rate
from queueworker.settings import WorkerSettings
from queueworker.runtime.worker import Worker
from tests.support import (
    FAST_LEASES, WatchedDuty, WorkerProcess, builtin_registry, query, scalar, start_listening, until,
    wait_until)

HANDLERS = ("--handlers", "tests.flow_handlers")


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("5m", 300), ("2h", 7200), ("1d", 86400),
                                               ("0.5s", 0.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5s", "nan", "infs", "5x", "400d", "m"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(("text", "rate"), [("50/s", 50), ("300/m", 5), ("3600/h", 1)])
def test_rates(text, rate):
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["50", "50/x", "0/s", "-1/s", "nan/s", "2000000/s", "/s"])
def test_bad_rates_are_refused(text):
    with pytest.raises(ValueError, match="not a rate"):
        parse_rate(text)


def test_bad_settings_are_refused_before_the_database():
    for call, message in ((lambda: operations.set_limits(None, "q", rate_per_second=0), "rate_per_second"),
                          (lambda: operations.set_limits(None, "q", burst=5), "burst needs a rate"),
                          (lambda: operations.set_limits(None, "q", max_running=0), "max_running"),
                          (lambda: operations.set_breaker(None, "q", failures=3), "cooldown"),
                          (lambda: operations.pause(None, "q", seconds=math.nan), "pause for")):
        with pytest.raises(ValueError, match=message):
            call()


# -- the statements -----------------------------------------------------------------------------

def _claim(conn, statement: Statement, queue: str, limit: int = 100) -> list[int]:
    return [row.id for row in statements.fetch(conn, statement, ClaimParams(
        queue=queue, limit=limit, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60))]


@pytest.mark.integration
def test_the_claim_statements_hold_each_limit(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [{"task": "t", "queue": "q"}] * 50)
        operations.pause(conn, "q")
        assert _claim(conn, CLAIM, "q") == [], "the plain claim steps aside for a limited queue"
        assert _claim(conn, CLAIM_LIMITED, "q") == [], "paused"
        operations.resume(conn, "q")
        assert _claim(conn, CLAIM, "q", 1) != [], "a queue whose settings are all gone is plain again"

        operations.set_limits(conn, "q", rate_per_second=2, burst=3)
        assert len(_claim(conn, CLAIM_LIMITED, "q")) == 3, "a full bucket"
        assert _claim(conn, CLAIM_LIMITED, "q") == [], "an empty one"
        time.sleep(0.6)
        assert len(_claim(conn, CLAIM_LIMITED, "q")) == 1, "one token back after half a second at 2/s"

        operations.set_limits(conn, "q", max_running=5)
        running = scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE queue = 'q' AND state = 'running'")
        assert len(_claim(conn, CLAIM_LIMITED, "q")) == 5 - running

        operations.set_limits(conn, "q")
        operations.set_breaker(conn, "q", failures=2, cooldown_seconds=0.5)
        for state in ("closed", "open"):
            row, = statements.fetch(conn, RECORD_BREAKER, RecordBreakerParams(queue="q", any_succeeded=False,
                                                                              trailing_failures=1))
            assert row == (state, "closed" if state == "closed" else "open") or row.now_state == "open"
        assert _claim(conn, CLAIM_LIMITED, "q") == [], "open: nothing"
        time.sleep(0.6)
        assert len(_claim(conn, CLAIM_LIMITED, "q")) == 1, "after the cooldown: one probe"
        assert _claim(conn, CLAIM_LIMITED, "q") == [], "half-open: only that probe"
        assert statements.fetch(conn, RECORD_BREAKER, RecordBreakerParams(
            queue="q", any_succeeded=True, trailing_failures=0)) == [("half_open", "closed")]
        assert len(_claim(conn, CLAIM_LIMITED, "q", 4)) == 4, "closed again"
    changes = [change for change, in query(dsn, "SELECT change FROM queueworker.queue_events WHERE queue = 'q' "
                                                "ORDER BY id")]
    assert changes == ["paused", "resumed", "limits", "limits", "limits", "limits", "breaker_open",
                       "breaker_half_open", "breaker_closed"]


@pytest.mark.integration
def test_a_claim_that_waited_for_the_queue_sees_the_claim_it_waited_for(dsn):
    """A claims the whole cap and holds the queue's row; B's claim waits for it. Once A commits, B
    must count A's tasks: the worker locks the row in a statement of its own before claiming, so
    the claim's snapshot is taken after the wait (inside one statement it would predate A's commit,
    and B would claim a second full cap)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "q", max_running=3)
        enqueue_many(conn, [{"task": "t", "queue": "q"}] * 20)
    params = ClaimParams(queue="q", limit=10, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60)
    assert race_two_claims(dsn, Bound(LOCK_QUEUE, LockQueueParams(queue="q")), CLAIM_LIMITED, params) == (3, 0)
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'running'") == 3


def race_two_claims(dsn: str, lock: Bound, claim: Statement, params: ClaimParams) -> tuple[int, int]:
    """How many tasks each of two claims takes when the second waits for the first's lock: the first
    locks and claims in an open transaction, the second waits for the lock (checked in pg_locks),
    then the first commits."""
    async def race() -> tuple[int, int]:
        holder = await psycopg.AsyncConnection.connect(dsn)
        waiter = DutyConnection(dsn, "test-waiter")
        try:
            await statements.execute_async(holder, lock.statement, lock.params)
            first = await statements.fetch_async(holder, claim, params)
            second = asyncio.create_task(waiter.fetch(claim, params, first=lock))
            await wait_for_lock_wait(dsn)
            await holder.commit()
            return len(first), len(await second)
        finally:
            await holder.close()
            await waiter.close()

    return asyncio.run(race())


async def wait_for_lock_wait(dsn: str) -> None:
    """Returns once some session of the database waits for a lock."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        async def waiting() -> int:
            return (await (await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                              " AND datname = current_database()")).fetchone())[0]
        await until(waiting, 10, "a session to wait for the queue's lock", interval=0.05)


# -- real workers -------------------------------------------------------------------------------

def claim_times(dsn: str, queue: str) -> list[float]:
    return [row[0] for row in query(dsn, """
        SELECT extract(epoch FROM e.at)::float8 FROM queueworker.task_events e JOIN queueworker.tasks t
        ON t.id = e.task_id WHERE t.queue = %s AND e.to_state = 'running' ORDER BY e.at""", (queue,))]


def claim_passes(port: int) -> float:
    """Claim passes a worker process has ended without a full batch (its fetch loop's transitions
    from Claiming to Backoff), read from its metrics; 0 until it serves them."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "queueworker_worker_state_transitions_total"
               and sample.labels == {"from_state": "Claiming", "to_state": "Backoff"})


@pytest.mark.integration
def test_a_paused_queue_is_not_claimed_and_a_timed_pause_wakes_its_workers_when_it_ends(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.pause(conn, "held")
    port = free_port()
    worker = WorkerProcess(dsn, "--queue", "held", "--poll-max-seconds", "30",
                           "--metrics-port", str(port), "--metrics-address", "127.0.0.1")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [{"task": "qw.noop", "queue": "held"}] * 20)
        # Two more claim passes ended: the second began after the tasks were in (the first may not have).
        passes = claim_passes(port)
        wait_until(lambda: claim_passes(port) >= passes + 2, timeout=40, message="two claim passes after the enqueue")
        assert claim_times(dsn, "held") == [], "nothing claimed while paused"
        with psycopg.connect(dsn, autocommit=True) as conn:
            operations.pause(conn, "held", seconds=1.0)
            ends = time.time() + 1.0
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 20,
                   timeout=10, message="the queue to drain once the pause ends")
    finally:
        worker.stop()
    first = claim_times(dsn, "held")[0]
    assert ends - 0.05 <= first < ends + 1.5, "woken when the pause ended, not at the 30 s poll"


@pytest.mark.integration
def test_a_limit_set_at_runtime_reaches_a_running_worker_by_notification(dsn, monkeypatch):
    """A running worker whose queue has no flow control re-reads its settings on its own only every
    SAFETY_REFRESH_SECONDS, ten years here: a rate limit set at runtime reaches it through the
    notification of the statement that sets it. While the queue is limited the worker re-reads
    every REFRESH_SECONDS; once the limit is removed, it waits for the safety refresh again."""
    safety = 10 * 365 * 86400.0
    monkeypatch.setattr(flow, "SAFETY_REFRESH_SECONDS", safety)

    async def set_limits(**limits: float) -> None:
        def change() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                operations.set_limits(conn, "notified", **limits)
        await asyncio.to_thread(change)

    async def scenario() -> int:
        worker = Worker(dsn, WorkerSettings(queues=("notified",)), builtin_registry())
        duty = WatchedDuty(worker, "flow", worker.flow.wake)
        running = await start_listening(worker, duty)
        try:
            assert duty.delays[-1] > safety - 60 and not worker.flow.limited
            ended = len(duty.delays)
            await set_limits(rate_per_second=50)
            assert await duty.next_delay(ended) <= REFRESH_SECONDS
            assert worker.flow.token_interval("notified") == 1 / 50
            await set_limits()
            await until(lambda: not worker.flow.limited and duty.delays[-1] > safety - 60, 60,
                        "the limit's removal to reach the worker")
        finally:
            worker.request_stop()
        return await running

    assert asyncio.run(scenario()) == 0


def most_beyond_the_rate(times: list[float], rate: float) -> float:
    """The most tasks claimed in any window [t_i, t_j] between two claims beyond `rate` × its
    length: the token bucket promises at most its burst. With c(k) = k - rate × t_k a window holds
    j - i + 1 = c(j) - c(i) + rate × (t_j - t_i) + 1 claims, so the answer is the largest rise of c."""
    most, lowest = 0.0, math.inf
    for k, at in enumerate(times):
        level = k - rate * at
        lowest = min(lowest, level)
        most = max(most, level - lowest + 1)
    return most


@pytest.mark.integration
def test_a_rate_limit_holds_across_four_workers_never_beyond_its_bucket_and_keeps_the_queue_moving(dsn):
    """What the limit promises: in no window do more tasks start than the bucket allows (its burst
    plus the rate times the window's length; `rate + burst` in any second), and every task runs.
    The rate reached is only bounded generously from below (at least half the limit), to show the
    limit does not starve the queue without tying the test to the machine's speed."""
    rate, burst, count = 50, 10, 600
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "metered", rate_per_second=rate, burst=burst)
        enqueue_many(conn, [{"task": "qw.noop", "queue": "metered"}] * count)
    workers = [WorkerProcess(dsn, "--queue", "metered", "--concurrency", "20") for _ in range(4)]
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == count,
                   timeout=4 * count / rate, message=f"all {count} tasks to succeed")
    finally:
        for worker in workers:
            worker.stop()
    times = claim_times(dsn, "metered")
    assert len(times) == count
    beyond = most_beyond_the_rate(times, rate)
    busiest = max(bisect.bisect_left(times, t + 1.0) - i for i, t in enumerate(times))
    measured = (count - burst) / (times[-1] - times[0])  # the first `burst` came from the full bucket at once
    print(f"rate limit {rate}/s burst {burst}: {measured:.2f} tasks/s over {times[-1] - times[0]:.1f} s, "
          f"at most {busiest} in one second, at most {beyond:.2f} beyond the rate in any window")
    # Less than one whole task of slack: a claim's time is its transaction's start, a little before
    # it took the queue's lock, which orders the claims the bucket actually counted.
    assert beyond < burst + 1, beyond
    assert busiest <= rate + burst, busiest
    assert measured >= rate / 2, measured


@pytest.mark.integration
def test_a_claim_the_bucket_cut_short_is_tried_again_when_the_next_token_is_due(dsn):
    """A worker that never polls (an hour between idle polls) and hears of no new task: once its
    first claims took the bucket's tokens, only its own timer (one token's time after a claim the
    bucket cut short) brings it back, and every task runs at the rate."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "timed", rate_per_second=10, burst=1)
        enqueue_many(conn, [{"task": "qw.noop", "queue": "timed"}] * 20)
    worker = WorkerProcess(dsn, "--queue", "timed", "--poll-min-seconds", "3600", "--poll-max-seconds", "3600")
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 20,
                   timeout=60, message="every task, each claimed when a token was due")
    finally:
        worker.stop()


@pytest.mark.integration
@pytest.mark.parametrize("limits", [{"max_running": 5}, {"per_key_max_running": 1}], ids=["queue-cap", "key-cap"])
def test_a_claim_a_cap_cut_short_is_tried_again_once_the_worker_has_written_outcomes(dsn, limits):
    """A worker that never polls (an hour between idle polls) and hears of no new task, with more
    slots than the cap lets it fill (5 running at most: for the queue, or 1 for each of 5 keys): each
    claim takes 5, and only the outcomes it writes make room for the next. Writing them must bring
    it back to claim, or it sleeps for the hour with tasks waiting (it claimed once per idle poll,
    0.2 s by default: 50 tasks a second however short they were)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "capped", **limits)
        enqueue_many(conn, [{"task": "qw.noop", "queue": "capped", "key": f"k{n % 5}"} for n in range(100)])
    worker = WorkerProcess(dsn, "--queue", "capped", "--concurrency", "20", "--poll-min-seconds", "3600",
                           "--poll-max-seconds", "3600")
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 100,
                   timeout=60, message="every task, each claimed once an outcome made room")
    finally:
        worker.stop()


@pytest.mark.integration
def test_a_worker_whose_claim_found_the_bucket_empty_comes_back_when_a_token_is_due(dsn):
    """Two workers that never poll (an hour between idle polls), one slot each, and hear of no new
    task: a claim that filled a worker's slot sets no timer (the bucket did not cut it short), and
    the claims that follow find the bucket empty, the token taken by the other worker or not due
    yet. Each of those must bring its worker back when a token is due, or both sleep for the hour
    with tasks waiting."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "contended", rate_per_second=4, burst=1)
        enqueue_many(conn, [{"task": "qw.noop", "queue": "contended"}] * 10)
    workers = [WorkerProcess(dsn, "--queue", "contended", "--concurrency", "1", "--poll-min-seconds", "3600",
                             "--poll-max-seconds", "3600") for _ in range(2)]
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 10,
                   timeout=90, message="every task, each claimed when a token was due")
    finally:
        for worker in workers:
            worker.stop()


@pytest.mark.integration
def test_a_global_concurrency_cap_is_never_exceeded(dsn, tmp_path):
    """Four workers with twenty slots each, and a cap of three. The handlers log when they start and
    end: a handler runs inside its task's time in `running` (after the claim commits, before the
    outcome does), so if more than three ever ran at once, more than three tasks were running."""
    log = tmp_path / "handlers.log"
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "capped", max_running=3)
        enqueue_many(conn, [{"task": "flow.hold", "queue": "capped",
                             "payload": {"seconds": 0.1, "log": str(log)}}] * 60)
    workers = [WorkerProcess(dsn, "--queue", "capped", "--concurrency", "20", *HANDLERS) for _ in range(4)]
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 60,
                   timeout=60, message="all sixty to finish")
    finally:
        for worker in workers:
            worker.stop()
    edges = [(float(at), int(step)) for at, step in (line.split() for line in log.read_text().splitlines())]
    assert len(edges) == 120
    running, most = 0, 0
    for _, step in sorted(edges):  # ends before starts at one instant
        running += step
        most = max(most, running)
    assert most == 3, most


@pytest.mark.integration
def test_a_breaker_opens_after_n_failures_probes_after_its_cooldown_and_closes_on_a_success(dsn, tmp_path):
    down = tmp_path / "down"
    down.touch()
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "scrape", failures=3, cooldown_seconds=1.0)
        enqueue_many(conn, [{"task": "flow.source", "queue": "scrape", "max_attempts": 1,
                             "payload": {"down_marker": str(down)}}] * 30)
    worker = WorkerProcess(dsn, *HANDLERS, "--queue", "scrape", "--concurrency", "1", *FAST_LEASES)
    try:
        wait_until(lambda: "breaker_open" in breaker_changes(dsn), timeout=20, message="the breaker to open")
        # Outcomes are written before the breaker counts them; a task run while it is open would
        # show below, in the count once the probe has failed.
        failed_while_open = scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'failed'")
        wait_until(lambda: breaker_changes(dsn).count("breaker_open") >= 2, timeout=20,
                   message="a failed probe to open it again")
        assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'failed'") == failed_while_open + 1
        down.unlink()
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'")
                   == 30 - failed_while_open - 1, timeout=30, message="the rest to succeed once closed")
    finally:
        worker.stop()
    # The third failure opens it, and the worker claimed nothing from the queue until the breaker
    # had counted that failure: nothing else ran.
    assert failed_while_open == 3, failed_while_open
    changes = breaker_changes(dsn)
    assert changes[:5] == ["breaker_open", "breaker_half_open", "breaker_open", "breaker_half_open",
                           "breaker_closed"], changes
    shown = query(dsn, "SELECT by_user FROM queueworker.queue_events WHERE queue = 'scrape'")
    assert shown, "audited"


@pytest.mark.integration
@pytest.mark.parametrize("per_key", [False, True], ids=["queue-breaker", "key-breaker"])
def test_the_probe_is_claimed_when_the_cooldown_ends_not_at_the_next_idle_poll(dsn, tmp_path, per_key):
    """A worker that never polls (an hour between idle polls) and hears of no new task: the first
    failure opens the breaker (the queue's, or its key's), and only the end of its cooldown, which
    the worker reads with the queue's settings, brings it back to claim the probe; the probe's
    success closes the breaker and the rest run."""
    down = tmp_path / "down"
    down.touch()
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "scrape", failures=1, cooldown_seconds=2.0, per_key=per_key)
        enqueue_many(conn, [{"task": "flow.source", "queue": "scrape", "max_attempts": 1, "key": "site",
                             "payload": {"down_marker": str(down)}}] * 5)
    worker = WorkerProcess(dsn, *HANDLERS, "--queue", "scrape", "--concurrency", "1", "--poll-min-seconds", "3600",
                           "--poll-max-seconds", "3600")
    prefix = "key_breaker_" if per_key else "breaker_"
    try:
        wait_until(lambda: prefix + "open" in breaker_changes(dsn, prefix), timeout=20, message="the breaker to open")
        down.unlink()
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 4,
                   timeout=30, message="the probe at the cooldown's end, then the rest")
    finally:
        worker.stop()
    assert breaker_changes(dsn, prefix)[:3] == [prefix + "open", prefix + "half_open", prefix + "closed"]


def breaker_changes(dsn: str, prefix: str = "breaker_") -> list[str]:
    """The changes of the queue `scrape`'s breakers audited so far, in order: the queue's, or with
    `prefix` "key_breaker_" its keys'."""
    return [change for change, in query(dsn, "SELECT change FROM queueworker.queue_events WHERE queue = 'scrape' "
                                             "AND change LIKE %s ORDER BY id", (prefix + "%",))]

"""Forged notifications, for real: any login may LISTEN and NOTIFY on any channel, so every
notification queueworker hears is a hint it checks against the database before acting. A login
with no grants at all, knowing what it overhears (a real cancel names the worker) and what it can
guess (task ids follow a sequence, a first attempt's lease token is 1), sends every kind of
notification on every channel a worker, `wait_for` and the controller listen to: handlers keep
running, the tasks finish in one attempt, settings and schedules stay as they were, and the work
a flood causes is bounded, as counters show. Real cancels still stop handlers at once."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql as pgsql

from queueworker import enqueue, wait_for
from queueworker_controller.queuedb import QueueDatabases
from queueworker_controller.reconcile import ObjectMemory, QueueWorkerObject, Reconciler
from queueworker_controller.redaction import KnownSecrets
from queueworker.db.inspect import TASK
from queueworker.db.notify import CANCEL_CHANNEL, CRON_CHANNEL, FINISHED_CHANNEL, NOTIFY_CHANNEL, QUEUES_CHANNEL
from queueworker.dev.localpg import free_port
from tests.support import WorkerProcess, query, until, wait_until
from tests.test_controller_reconcile import SPEC, FakeKube, ManualClock
from tests.test_long_tasks import _wait_report
from tests.test_roles import installation, qw  # noqa: F401 - `installation` is a fixture

pytestmark = pytest.mark.integration

QUEUE = "forged"
CHANNELS = (NOTIFY_CHANNEL, CANCEL_CHANNEL, QUEUES_CHANNEL, CRON_CHANNEL, FINISHED_CHANNEL)
FLOOD = 500  # forged notices per kind and target: distinct payloads, so one statement sends them all
SETTINGS = ("SELECT name, paused_until, rate_per_second, burst, max_running, breaker_failures, "
            "breaker_cooldown_seconds, breaker_state, updated_at FROM queueworker.queues ORDER BY name")
SCHEDULES = "SELECT name, expression, paused, source, updated_at FROM queueworker.cron_jobs ORDER BY name"


@contextlib.contextmanager
def grantless_login(admin: str) -> Iterator[str]:
    """A login role with no grants and no group (what PUBLIC may do, it may: connect, LISTEN,
    NOTIFY); its DSN. Dropped afterwards."""
    name, password = f"qw_intruder_{secrets.token_hex(4)}", secrets.token_urlsafe(18)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            pgsql.Identifier(name), pgsql.Literal(password)))
    try:
        dsn = psycopg.conninfo.make_conninfo(admin, user=name, password=password)
        with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT 1 FROM queueworker.tasks")
        yield dsn
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(name)))


class Metrics:
    """A worker process's Prometheus counters, read over HTTP."""

    def __init__(self, port: int):
        self._url = f"http://127.0.0.1:{port}/metrics"

    def read(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = urllib.request.urlopen(self._url, timeout=5).read().decode()
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    def ready(self) -> bool:
        try:
            self.read()
        except OSError:
            return False
        return True


def counted(sample: dict, name: str, **labels: str) -> float:
    """The sum of counter `name` over the samples whose labels include `labels`."""
    return sum(value for (sample_name, sample_labels), value in sample.items()
               if sample_name == name and labels.items() <= dict(sample_labels).items())


def heard(sample: dict, channel: str, outcome: str | None = None) -> float:
    labels = {"channel": channel} if outcome is None else {"channel": channel, "outcome": outcome}
    return counted(sample, "queueworker_notifications_total", **labels)


def running_attempts(admin: str, ids: list[int]) -> dict[int, tuple[str, int, int]]:
    return {row[0]: row[1:] for row in query(
        admin, "SELECT id, state::text, attempts, lease_token FROM queueworker.tasks WHERE id = ANY(%s)", (ids,))}


def test_a_login_without_grants_cannot_stop_reconfigure_or_spin_a_worker_by_notifying(installation, tmp_path):
    admin, login = installation.admin, installation.logins
    installation.install()
    limited = qw("limit", QUEUE, "--concurrency", "100", "--dsn", login["operator"])
    assert limited.returncode == 0, limited.stderr
    release = tmp_path / "release"
    reports = {}
    with psycopg.connect(login["producer"], autocommit=True) as conn:
        # `victim` is cancelled for real first (the intruder overhears that notice), `marker` last,
        # after the flood: once its handler has stopped, the worker has been through every notice.
        for name in ("victim", "first", "second", "third", "marker"):
            reports[name] = tmp_path / f"{name}.json"
        ids = {name: enqueue(conn, "long.until_released", {"release": str(release), "report": str(report)},
                             queue=QUEUE) for name, report in reports.items()}
    bystanders = [ids["first"], ids["second"], ids["third"]]
    port = free_port()
    worker = WorkerProcess(login["worker"], "--queue", QUEUE, "--concurrency", "8", "--metrics-port", str(port),
                           "--handlers", "tests.long_task_handlers")
    metrics = Metrics(port)
    with grantless_login(admin) as intruder, psycopg.connect(intruder, autocommit=True) as spy, \
            psycopg.connect(intruder, autocommit=True) as forger:
        try:
            for channel in CHANNELS:
                spy.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
            wait_until(lambda: {state for state, _, _ in running_attempts(admin, list(ids.values())).values()}
                       == {"running"}, message="every task to start")
            wait_until(metrics.ready, message="the worker's metrics")

            # One real cancel: what the intruder overhears names the worker and the lease token.
            cancelled = qw("cancel", str(ids["victim"]), "--dsn", login["operator"])
            assert cancelled.returncode == 0, cancelled.stderr
            assert _wait_report(reports["victim"])["reason"] == "cancelled", "a real cancel stops the handler"
            overheard = next(notice for notice in spy.notifies(timeout=10) if notice.channel == CANCEL_CHANNEL)
            worker_id, task_id, token = overheard.payload.split(" ")
            assert (int(task_id), token) == (ids["victim"], "1")
            # The other tasks' ids are its neighbours; their first attempts' tokens are 1 too: the
            # intruder's guesses are the real leases.
            assert {key: attempt[1:] for key, attempt in running_attempts(admin, bystanders).items()} == \
                dict.fromkeys(bystanders, (1, 1))

            before = metrics.read()
            settings, schedules = query(admin, SETTINGS), query(admin, SCHEDULES)
            tasks = query(admin, "SELECT count(*) FROM queueworker.tasks")
            sent = _forge_every_kind(forger, worker_id, bystanders)
            cancelled = qw("cancel", str(ids["marker"]), "--dsn", login["operator"])
            assert cancelled.returncode == 0, cancelled.stderr
            assert _wait_report(reports["marker"])["reason"] == "cancelled", "a real cancel still stops it"
            after = metrics.read()

            assert not any(path.exists() for name, path in reports.items() if name not in ("victim", "marker")), \
                "no handler the intruder named was stopped"
            assert {key: attempt[:2] for key, attempt in running_attempts(admin, bystanders).items()} == \
                dict.fromkeys(bystanders, ("running", 1))
            assert query(admin, SETTINGS) == settings and query(admin, SCHEDULES) == schedules
            assert query(admin, "SELECT count(*) FROM queueworker.tasks") == tasks, "nothing enqueued"
            for channel, count in sent.items():
                assert heard(after, channel) - heard(before, channel) >= count, \
                    f"every notice on {channel} reached the worker"

            # The work the flood caused: at most one claim per wake-up acted on, at most one look at
            # the tasks per cancellation notice naming a running attempt, and every such notice
            # the database did not confirm counted.
            woken = heard(after, NOTIFY_CHANNEL, "acted") - heard(before, NOTIFY_CHANNEL, "acted")
            claims = counted(after, "queueworker_claims_total") - counted(before, "queueworker_claims_total")
            named = heard(after, CANCEL_CHANNEL, "acted") - heard(before, CANCEL_CHANNEL, "acted")
            looks = (counted(after, "queueworker_cancel_checks_total", reason="notified")
                     - counted(before, "queueworker_cancel_checks_total", reason="notified"))
            unconfirmed = (counted(after, "queueworker_cancels_unconfirmed_total")
                           - counted(before, "queueworker_cancels_unconfirmed_total"))
            print(f"forged {sum(sent.values())} notices: {woken:g} wake-ups caused {claims:g} claims; "
                  f"{named:g} cancellation notices caused {looks:g} looks, {unconfirmed:g} not confirmed")
            assert woken >= sent[NOTIFY_CHANNEL] - 3, "every well-formed forged wake-up acted on"
            assert 0 < claims <= woken
            assert named == len(bystanders) * FLOOD + 1
            assert 0 < looks <= named and 0 < unconfirmed <= len(bystanders) * FLOOD
            assert heard(after, CANCEL_CHANNEL, "malformed") - heard(before, CANCEL_CHANNEL, "malformed") == 3
            assert heard(after, CANCEL_CHANNEL, "ignored") - heard(before, CANCEL_CHANNEL, "ignored") == FLOOD
            # A look at the settings or the schedules per notice at most (coalesced: usually one).
            for duty, channel in (("flow", QUEUES_CHANNEL), ("cron", CRON_CHANNEL)):
                passes = (counted(after, "queueworker_duty_passes_total", duty=duty)
                          - counted(before, "queueworker_duty_passes_total", duty=duty))
                print(f"{sent[channel]} forged notices on {channel}: {passes:g} passes of the {duty} duty")
                assert 0 < passes <= sent[channel]

            release.touch()
            wait_until(lambda: {state for state, _, _ in running_attempts(admin, bystanders).values()}
                       == {"succeeded"}, message="the named tasks to finish")
        finally:
            worker.stop()
    assert {key: attempt[:2] for key, attempt in running_attempts(admin, bystanders).items()} == \
        dict.fromkeys(bystanders, ("succeeded", 1)), "each in one attempt"
    assert query(admin, "SELECT count(*) FROM queueworker.task_events WHERE task_id = ANY(%s) "
                        "AND to_state = 'running'", (bystanders,)) == [(len(bystanders),)], "claimed once each"
    log = worker.log()
    assert "Traceback" not in log and "malformed" not in log, "forged notices neither fail nor flood the log"


def _forge_every_kind(forger: psycopg.Connection, worker_id: str, targets: list[int]) -> dict[str, int]:
    """Sends, as the intruder, every kind of notice on every channel a worker listens to; how many
    went on each. Each statement sends FLOOD distinct payloads (a transaction's duplicates would
    be delivered once)."""
    sent = dict.fromkeys((NOTIFY_CHANNEL, CANCEL_CHANNEL, QUEUES_CHANNEL, CRON_CHANNEL), 0)

    def notify(channel: str, statement: str, params: tuple = ()) -> None:
        sent[channel] += len(forger.execute(statement, params).fetchall())

    # Wake-ups: due now (times in the past), due in 2100 (a timer), and garbage.
    notify(NOTIFY_CHANNEL, f"SELECT pg_notify('{NOTIFY_CHANNEL}', %s || ' ' || (extract(epoch FROM now()) - n)::text) "
                           "FROM generate_series(1, %s) n", (QUEUE, FLOOD * 4))
    notify(NOTIFY_CHANNEL, f"SELECT pg_notify('{NOTIFY_CHANNEL}', %s || ' ' || (4102444800 + n)::text) "
                           "FROM generate_series(1, %s) n", (QUEUE, FLOOD))
    for garbage in ("soon", "nan", "inf"):
        notify(NOTIFY_CHANNEL, "SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, f"{QUEUE} {garbage}"))
    # Cancellations of the running attempts, each spelled FLOOD ways (leading zeros), and garbage.
    for task_id in targets:
        notify(CANCEL_CHANNEL, "SELECT pg_notify(%s, %s || ' ' || lpad(%s::text, length(%s::text) + n, '0') "
                               "|| ' 1') FROM generate_series(0, %s - 1) n",
               (CANCEL_CHANNEL, worker_id, task_id, task_id, FLOOD))
    # Attempts this worker does not run (a lease token not the task's): ignored, without a look.
    notify(CANCEL_CHANNEL, "SELECT pg_notify(%s, %s || ' ' || %s || ' ' || (n + 2)) FROM generate_series(1, %s) n",
           (CANCEL_CHANNEL, worker_id, targets[0], FLOOD))
    for garbage in ("x 1", "1", "1 2 3"):
        notify(CANCEL_CHANNEL, "SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, f"{worker_id} {garbage}"))
    # A queue's settings and the schedules "changed": the same payload takes a statement each.
    for _ in range(FLOOD // 10):
        notify(QUEUES_CHANNEL, "SELECT pg_notify(%s, %s)", (QUEUES_CHANNEL, QUEUE))
    notify(CRON_CHANNEL, "SELECT pg_notify(%s, 'forged-' || n) FROM generate_series(1, %s) n", (CRON_CHANNEL, FLOOD))
    return sent


class CountingCursor(psycopg.Cursor):
    """Counts the statements that look a task up (queueworker.db.inspect.TASK)."""

    looks = 0

    def execute(self, query, params=None, **kwargs):
        if query == TASK.text:
            CountingCursor.looks += 1
        return super().execute(query, params, **kwargs)


def test_forged_finish_notices_cost_wait_for_at_most_two_looks_per_second(dsn):
    """`wait_for` looks a task up whenever a notice says it finished; a notice that lied has the
    next wait run its full second, so a flood costs at most two looks per second, however many
    notices come, and never ends the wait."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "qw.noop", queue="nobody-works-this", notify_on_finish=True)
    stop, sent = threading.Event(), []

    def flood(intruder: str) -> None:
        with psycopg.connect(intruder, autocommit=True) as forger:
            while not stop.is_set():
                forger.execute("SELECT pg_notify(%s, %s)", (FINISHED_CHANNEL, str(task_id)))
                sent.append(1)

    timeout = 3.0
    with grantless_login(dsn) as intruder, psycopg.connect(dsn, autocommit=True,
                                                           cursor_factory=CountingCursor) as conn:
        flooding = threading.Thread(target=flood, args=(intruder,))
        flooding.start()
        try:
            wait_until(lambda: len(sent) > 100, message="the flood to start")
            with pytest.raises(TimeoutError, match="is still pending"):
                wait_for(conn, task_id, timeout=timeout)
        finally:
            stop.set()
            flooding.join()
    print(f"{len(sent)} forged finish notices, {CountingCursor.looks} looks at the task")
    assert len(sent) > 100
    # One look to begin with, then per second at most one early look (a notice) and one after it.
    assert CountingCursor.looks <= 1 + 2 * int(timeout)


def test_a_flood_of_forged_announcements_makes_the_controller_tick_at_most_once_a_second(installation):
    """The controller's LISTEN (as the controller login) hears every notice a login without grants
    sends on `queueworker`; each is a hint that makes a tick due, and a tick reads the depth from
    the database. However many come, they make at most one tick a second of the controller's own
    clock: while it stands still, a flood makes none; a second on, one."""
    installation.install()
    controller = installation.logins["controller"]
    queue = SPEC["queue"]
    kube = FakeKube()
    kube.secret = controller
    ticks: list[object] = []
    heard: list[float] = []  # what a second QueueWorker of the same queue is told

    async def publish(obj, result) -> None:
        ticks.append(result)

    def flood(intruder: str) -> int:
        with psycopg.connect(intruder, autocommit=True) as forger:
            return sum(len(forger.execute(statement, (NOTIFY_CHANNEL, queue, FLOOD)).fetchall()) for statement in (
                "SELECT pg_notify(%s, %s || ' ' || (extract(epoch FROM now()) - n)::text) "
                "FROM generate_series(1, %s) n",
                "SELECT pg_notify(%s, %s || ' ' || (4102444800 + n)::text) FROM generate_series(1, %s) n",
                "SELECT pg_notify(%s, %s || ' soon' || n) FROM generate_series(1, %s) n"))

    async def main(intruder: str) -> None:
        clock, databases = ManualClock(), QueueDatabases()
        reconciler = Reconciler(kube, databases, secrets=KnownSecrets(),  # type: ignore[arg-type]
                                monotonic=clock.monotonic, wait=clock.wait)
        databases.bind("other", controller, queue, heard.append)
        loop = asyncio.create_task(reconciler.run(
            lambda: QueueWorkerObject("w", "ns", "uid", 1, SPEC, {}), ObjectMemory(), publish))
        try:
            await until(lambda: len(ticks) == 1 and databases.listening(controller), message="a tick, and LISTEN")
            for second in (1, 2):
                heard.clear()
                sent = await asyncio.to_thread(flood, intruder)
                await until(lambda: len(heard) >= 2 * FLOOD, message="the well-formed notices to arrive")
                assert len(ticks) == second, "no tick within the second of the last one, however many notices"
                await clock.advance(1)
                await until(lambda: len(ticks) == second + 1, message="the one tick the notices made due")
            assert len(heard) == 2 * FLOOD and sent == 3 * FLOOD, "the garbage reached nobody"
        finally:
            loop.cancel()
            reconciler.close()
            databases.close()

    with grantless_login(installation.admin) as intruder:
        asyncio.run(main(intruder))

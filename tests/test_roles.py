"""docs/database-roles.sql, for real: the roles it creates run every flow of theirs with only its
grants, and nothing else. The migrator migrates (and owns the schema), a producer enqueues, a
real worker process works the queue, the controller reads depth and leases and LISTENs, an
operator runs status, retry and cancel and manages schedules; the audit trail holds against all of them."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict
from queueworker.scaling.policy import QueueDepth
from queueworker_controller.queuedb import QueueDatabases

from queueworker.client import operations
from queueworker.db import statements
from queueworker.db.enqueue import STAGING_STATE
from queueworker.db.lease import CLAIM, ClaimParams
from queueworker.db.statements import NO_PARAMS
from queueworker.runtime.cleaner import Cleaner
from queueworker.db.connection import DutyConnection
from queueworker.db.migrate import available_migrations
from queueworker.client.producer import COPY_THRESHOLD, enqueue, enqueue_chain, enqueue_many, start_run
from tests.schema_history import migrate_to
from tests.support import FAST_LEASES, WorkerProcess, query, scalar, until, wait_until
from tests.test_bulk_enqueue import STAGED

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent.parent / "docs" / "database-roles.sql"
GROUPS = ("migrator", "producer", "worker", "controller", "operator")
QUEUE = "roles"
RESCUE_QUEUE = "roles-rescue"   # holds a task whose worker "died" before the real worker starts
NOTIFY_QUEUE = "roles-notify"   # no worker: a task here only wakes the controller
CRON_QUEUE = "roles-cron"       # no worker: the slots of the operator's schedule wait here
NAMESPACE = "roles-test"
TERMINAL = ("succeeded", "failed", "cancelled")

OWNERS = """
SELECT DISTINCT pg_get_userbyid(owner) FROM (
    SELECT nspowner AS owner FROM pg_namespace WHERE nspname = 'queueworker'
    UNION ALL SELECT relowner FROM pg_class WHERE relnamespace = 'queueworker'::regnamespace
    UNION ALL SELECT typowner FROM pg_type WHERE typnamespace = 'queueworker'::regnamespace
    UNION ALL SELECT proowner FROM pg_proc WHERE pronamespace = 'queueworker'::regnamespace) AS objects
"""


@dataclass(frozen=True)
class Installation:
    admin: str
    logins: dict[str, str]  # group (e.g. "worker") -> DSN of a login role in queueworker_<group>

    def run_script(self) -> list[str]:
        """Runs docs/database-roles.sql as the superuser; returns its notices."""
        notices: list[str] = []
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary))
            conn.execute(SCRIPT.read_text())
        return notices

    def install(self) -> None:
        """The documented order: script, migrate as the migrator, script again."""
        assert any("run `queueworker migrate`" in notice for notice in self.run_script())
        migrated = qw("migrate", "--dsn", self.logins["migrator"])
        assert migrated.returncode == 0, migrated.stderr
        assert not any("run `queueworker migrate`" in notice for notice in self.run_script())


@pytest.fixture
def installation(blank_dsn):
    """A login role per group (created as docs/database-roles.sql shows), each with a password."""
    logins, names = {}, []
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        conn.execute(SCRIPT.read_text())  # the group roles must exist before logins join them
        for group in GROUPS:
            name, password = f"qw_{group}_{secrets.token_hex(4)}", secrets.token_urlsafe(18)
            conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                pgsql.Identifier(name), pgsql.Literal(password), pgsql.Identifier(f"queueworker_{group}")))
            if group == "migrator":
                conn.execute(pgsql.SQL("ALTER ROLE {} SET role = 'queueworker_migrator'").format(
                    pgsql.Identifier(name)))
            names.append(name)
            logins[group] = psycopg.conninfo.make_conninfo(blank_dsn, user=name, password=password)
    yield Installation(blank_dsn, logins)
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(name)))


def qw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queueworker.cli", *args], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"})


def states(dsn: str, ids: list[int]) -> dict[int, str]:
    return dict(query(dsn, "SELECT id, state::text FROM queueworker.tasks WHERE id = ANY(%s)", (ids,)))


def test_each_role_runs_its_flows_with_only_its_grants(installation):
    admin, login = installation.admin, installation.logins
    installation.install()
    assert [row[0] for row in query(admin, OWNERS)] == ["queueworker_migrator"]

    # Operator: flow control on the worker's queue, so the worker claims it with CLAIM_LIMITED (and
    # reports to a breaker) with its grants alone; loose enough to change nothing else.
    for command in (["limit", QUEUE, "--rate", "1000/s", "--concurrency", "100"],
                    ["breaker", QUEUE, "--failures", "1000", "--cooldown", "1s"],
                    ["pause", QUEUE, "--for", "1s"], ["resume", QUEUE]):
        changed = qw(*command, "--dsn", login["operator"])
        assert changed.returncode == 0, changed.stderr
    # Operator: a periodic schedule kept in the database, whose slots the worker enqueues.
    for command in (["add", "roles-cron", "--cron", "* * * * * *", "--task", "qw.noop", "--queue", CRON_QUEUE],
                    ["pause", "roles-cron"], ["resume", "roles-cron"], ["list", "--json"]):
        changed = qw("cron", *command, "--dsn", login["operator"])
        assert changed.returncode == 0, changed.stderr

    # Producer: the library, in one transaction of the application's, and the CLI.
    with psycopg.connect(login["producer"]) as conn:
        headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
        noop = enqueue(conn, "qw.noop", queue=QUEUE, headers=headers)
        flaky, broken, delayed = enqueue_many(conn, [
            {"task": "qw.fail", "payload": {"retryable": True, "message": "flaky"}, "queue": QUEUE, "max_attempts": 2},
            {"task": "qw.fail", "payload": {"retryable": False, "message": "broken"}, "queue": QUEUE},
            {"task": "qw.noop", "queue": QUEUE, "delay": 1.0}])
        orphan = enqueue(conn, "qw.noop", queue=RESCUE_QUEUE)
        # Unique tasks: a duplicate finds the holder; with replace, it takes the new values (due now).
        unique = enqueue(conn, "qw.noop", {"v": 1}, queue=QUEUE, dedupe_key="roles-unique", delay=3600)
        assert enqueue(conn, "qw.noop", {"v": 2}, queue=QUEUE, dedupe_key="roles-unique",
                       on_conflict="replace") == unique
        assert enqueue(conn, "qw.noop", {"v": 3}, queue=QUEUE, dedupe_key="roles-unique") == unique
        # A pipeline: the second stage waits, blocked, until the worker's success of the first.
        stage_one, stage_two = enqueue_chain(conn, [{"task": "qw.noop", "queue": QUEUE, "headers": headers}] * 2)
        # A run of two partitions with a consolidation and a watermark.
        run_id = start_run(conn, "roles-run", [{"task": "qw.noop", "queue": QUEUE}] * 2,
                           on_success={"task": "qw.noop", "queue": QUEUE}, watermark="roles")
    enqueued = qw("enqueue", "-q", "qw.sleep", "--payload", '{"seconds": 4}', "--queue", QUEUE, "--dsn", login["producer"])
    assert enqueued.returncode == 0, enqueued.stderr
    heartbeaten = int(enqueued.stdout)  # runs 4 s on a 3 s lease: only heartbeats keep it
    # A worker that died holding `orphan`: its lease is over, the real worker must rescue it.
    with psycopg.connect(login["worker"], autocommit=True) as conn:
        assert [row.id for row in statements.fetch(conn, CLAIM, ClaimParams(
            queue=RESCUE_QUEUE, limit=1, worker=uuid.uuid4(), lease_seconds=0, timeout_seconds=60))] == [orphan]

    worker = WorkerProcess(login["worker"], "--queue", QUEUE, "--queue", RESCUE_QUEUE, "--concurrency", "4",
                           "--handlers", "tests.cron_handlers",
                           "--retry-base-seconds", "0.2", "--drain-seconds", "0.5", *FAST_LEASES,
                           env={"POD_NAME": "worker-0", "POD_NAMESPACE": NAMESPACE})
    try:
        expected = {noop: "succeeded", flaky: "failed", broken: "failed", delayed: "succeeded",
                    heartbeaten: "succeeded", orphan: "succeeded", unique: "succeeded", stage_one: "succeeded",
                    stage_two: "succeeded"}
        wait_until(lambda: states(admin, list(expected)) == expected, timeout=60,
                   message="the worker to finish every task")
        assert dict(query(admin, "SELECT id, headers FROM queueworker.tasks WHERE headers IS NOT NULL")) == \
            dict.fromkeys([noop, stage_one, stage_two], headers), "headers stored, and moved with the rows"
        wait_until(lambda: scalar(admin, "SELECT state::text FROM queueworker.runs WHERE id = %s", (run_id,))
                   == "succeeded", timeout=60, message="the run to succeed")
        # The cron duty, as the worker role: declared the code's schedules, enqueued the operator's.
        wait_until(lambda: scalar(admin, "SELECT count(*) FROM queueworker.cron_jobs WHERE source = 'code'") == 2,
                   message="the code's schedules declared")
        wait_until(lambda: scalar(admin, "SELECT count(*) FROM queueworker.tasks WHERE queue = %s "
                                         "AND dedupe_key LIKE 'cron:roles-cron:%%'", (CRON_QUEUE,)) > 0,
                   message="the operator's schedule enqueued by the worker")
        with psycopg.connect(login["producer"], autocommit=True) as conn:
            held = enqueue(conn, "qw.sleep", {"seconds": 60}, queue=QUEUE)
        wait_until(lambda: states(admin, [held]) == {held: "running"}, message="the worker to claim the long task")
        depth, leases, woken = asyncio.run(_controller_flows(admin, login["controller"], login["producer"]))
        worker.signal(signal.SIGTERM)  # drains: the long task's lease goes back, the worker row goes
        assert worker.wait(30) == 0, worker.log()
    finally:
        worker.stop()
    log = worker.log()
    assert "permission denied" not in log, log
    assert psycopg.conninfo.conninfo_to_dict(login["worker"])["password"] not in log

    assert depth == QueueDepth(ready=0, running=1, retrying=0, oldest_ready_age_seconds=None, rate_per_second=1000.0,
                               max_running=100, mean_task_seconds=depth.mean_task_seconds,
                               finish_rate=depth.finish_rate, recent_task_seconds=depth.recent_task_seconds,
                               connection_limit=depth.connection_limit,
                               other_role_connections=depth.other_role_connections)
    assert depth.connection_limit > depth.other_role_connections > 0, "and the database's connection budget"
    assert depth.mean_task_seconds is not None, "the controller reads the durations a rate limit needs"
    assert depth.finish_rate and depth.recent_task_seconds is not None, "and what a throughput floor needs"
    assert [(lease.pod_name, lease.running, lease.draining) for lease in leases] == [("worker-0", 1, False)]
    assert woken, "the controller's LISTEN heard the producer's NOTIFY"
    assert query(admin, "SELECT state::text, attempts FROM queueworker.tasks WHERE id = %s", (held,)) == [
        ("pending", 0)], "released on drain without consuming the attempt"
    assert scalar(admin, "SELECT count(*) FROM queueworker.workers") == 0, "deregistered"
    assert dict(query(admin, "SELECT id, rescues FROM queueworker.tasks WHERE id = ANY(%s)",
                      ([heartbeaten, orphan],))) == {heartbeaten: 0, orphan: 1}

    assert query(admin, "SELECT change, by_user FROM queueworker.queue_events WHERE queue = %s ORDER BY id",
                 (QUEUE,)) == [(change, psycopg.conninfo.conninfo_to_dict(login["operator"])["user"])
                               for change in ("limits", "limits", "paused", "resumed")]
    assert scalar(admin, "SELECT consecutive_failures FROM queueworker.queues WHERE name = %s", (QUEUE,)) >= 0

    # The run's audit trail names the login behind each transition, written by its trigger.
    user = {group: psycopg.conninfo.conninfo_to_dict(dsn_)["user"] for group, dsn_ in login.items()}
    assert query(admin, "SELECT from_state::text, to_state::text, by_user FROM queueworker.run_events "
                        "WHERE run_id = %s ORDER BY id", (run_id,)) == [
        (None, "running", user["producer"]), ("running", "running", user["worker"]),
        ("running", "succeeded", user["worker"])]
    shown = qw("run", "show", str(run_id), "--dsn", login["operator"])
    assert shown.returncode == 0 and f"running   -> succeeded by {user['worker']}" in shown.stdout, shown

    deleted = qw("cron", "delete", "roles-cron", "--dsn", login["operator"])
    assert deleted.returncode == 0, deleted.stderr

    # Operator: status, cancel, retry.
    status = qw("status", "--queue", QUEUE, "--dsn", login["operator"])
    assert status.returncode == 0 and QUEUE in status.stdout, status.stderr
    for command, task_id, state in (("cancel", held, "cancelled"), ("retry", held, "pending"),
                                    ("retry", broken, "pending")):
        result = qw(command, str(task_id), "--dsn", login["operator"])
        assert result.returncode == 0, result.stderr
        assert states(admin, [task_id]) == {task_id: state}

    # Every task's history is complete, whoever changed it: the producer's inserts and the
    # operator's changes were audited by the definer triggers, the worker's by itself or them.
    everything = [noop, flaky, broken, delayed, heartbeaten, orphan, held]
    transitions = set(query(admin, "SELECT DISTINCT from_state::text, to_state::text FROM queueworker.task_events"))
    assert transitions >= {(None, "pending"), ("pending", "running"), ("running", "succeeded"),
                           ("running", "retrying"), ("retrying", "pending"), ("running", "failed"),
                           ("running", "pending"), ("pending", "cancelled"), ("cancelled", "pending"),
                           ("failed", "pending")}, transitions
    assert {row[0] for row in query(admin, "SELECT task_id FROM queueworker.task_events WHERE from_state IS NULL")
            } >= set(everything)
    assert query(admin, "SELECT payload, detail FROM queueworker.tasks JOIN queueworker.task_events e "
                        "ON e.task_id = tasks.id WHERE tasks.id = %s AND e.to_state = e.from_state", (unique,)) == [
        ({"v": 2}, {"replaced": ["payload", "run_after"]})]
    assert query(admin, "SELECT detail->>'error_type' FROM queueworker.task_events WHERE task_id = %s "
                        "AND from_state = 'running' AND to_state = 'pending'", (orphan,)) == [("LeaseExpired",)]

    # Worker: the cleaner duty, as the worker role, deletes finished history past the retention.
    with psycopg.connect(admin, autocommit=True) as conn:
        finished = [row[0] for row in conn.execute(
            "UPDATE queueworker.tasks SET finished_at = now() - interval '2 hours' WHERE state = ANY(%s) "
            "RETURNING id", (list(TERMINAL),))]
    run_tasks = [row[0] for row in query(admin, "SELECT id FROM queueworker.tasks WHERE run_id = %s", (run_id,))]
    assert sorted(finished) == sorted([noop, flaky, delayed, heartbeaten, orphan, unique, stage_one, stage_two,
                                       *run_tasks])
    assert asyncio.run(_clean(login["worker"])) == len(finished)
    remaining = {row[0] for row in query(admin, "SELECT task_id FROM queueworker.task_events")}
    assert not remaining & set(finished) and {broken, held} <= remaining


async def _controller_flows(admin: str, controller: str, producer: str) -> tuple[QueueDepth, list, bool]:
    """What the controller does each tick, through its own QueueDatabases: depth, leases, LISTEN."""
    databases = QueueDatabases()
    heard: list[float] = []
    try:
        # Two QueueWorkers on this database: one reads the worked queue, one watches the other.
        databases.bind("worked", controller, QUEUE)
        databases.bind("watched", controller, NOTIFY_QUEUE, heard.append)
        depth = await databases.depth(controller, QUEUE, cap=100, lookahead_seconds=60, throughput=True)
        leases = await databases.worker_leases(controller, NAMESPACE, QUEUE)
        await asyncio.to_thread(wait_until, lambda: scalar(
            admin, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'queueworker-controller-listen' "
                   "AND query LIKE 'LISTEN%%'"), message="the controller's LISTEN")
        await until(lambda: heard, 10, "the catch-up announcement that follows every LISTEN")
        heard.clear()
        with psycopg.connect(producer, autocommit=True) as conn:
            enqueue(conn, "qw.noop", queue=NOTIFY_QUEUE)
        return depth, leases, await until(lambda: bool(heard), 10, "the notification to reach the controller",
                                          interval=0.1)
    finally:
        databases.close()


async def _clean(worker: str) -> int:
    connection = DutyConnection(worker, "roles-test-cleaner")
    try:
        return (await Cleaner(connection, retention_seconds=3600, watermark_retention_seconds=0,
                              interval=300).clean_once()).tasks
    finally:
        await connection.close()


# (group, statement) pairs each group must be refused.
REFUSED = [
    *(("producer", statement) for statement in (
        "SELECT payload FROM queueworker.tasks",
        "SELECT result, error FROM queueworker.tasks",
        "SELECT id, queue, run_after FROM queueworker.tasks",
        "INSERT INTO queueworker.tasks (queue, task) VALUES ('default', 't')",
        "INSERT INTO queueworker.new_tasks (task, spec_hash) VALUES ('t', '\\x00')",
        "SELECT payload FROM queueworker.new_tasks",
        "UPDATE queueworker.new_tasks SET priority = 1",
        "DELETE FROM queueworker.new_tasks",
        "SELECT count(*) FROM queueworker.task_events",
        "UPDATE queueworker.tasks SET priority = 1",
        "DELETE FROM queueworker.tasks",
        "INSERT INTO queueworker.tasks (task, state) VALUES ('forged', 'succeeded')",
        "INSERT INTO queueworker.tasks_active (task) VALUES ('forged')",
        "INSERT INTO queueworker.tasks (task, dedupe_key) VALUES ('t', 'k')",
        "UPDATE queueworker.tasks SET dedupe_key = 'k'",
        "SELECT nextval('queueworker.tasks_id_seq')",
        "INSERT INTO queueworker.task_events (task_id, to_state, lease_token) VALUES (1, 'succeeded', 0)",
        "UPDATE queueworker.task_events SET detail = NULL",
        "DELETE FROM queueworker.task_events",
        "TRUNCATE queueworker.task_events",
        "SELECT * FROM queueworker.clean_finished(1, 0, 100)",
        "DELETE FROM queueworker.workers",
        "SELECT count(*) FROM queueworker.run_events",
        "SELECT count(*) FROM queueworker.runs",
        # The SQL producer API's helpers: only its definer functions call them, after their checks.
        "SELECT queueworker.enqueue_checked_specs('{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', "
        "'{}', '{}', '{}', '{}', '{}')",
        "SELECT queueworker.task_spec_problem('t', '{}', 'q', 0, NULL, NULL, 1, NULL, NULL, NULL, 'ignore', NULL, '{}', "
        "'cancel', NULL, false)",
    )),
    *(("controller", statement) for statement in (
        "SELECT payload FROM queueworker.tasks",
        "INSERT INTO queueworker.tasks (task) VALUES ('x')",
        "UPDATE queueworker.tasks SET priority = 1",
        "DELETE FROM queueworker.tasks",
        "INSERT INTO queueworker.task_events (task_id, to_state, lease_token) VALUES (1, 'succeeded', 0)",
        "DELETE FROM queueworker.task_events",
        "UPDATE queueworker.workers SET draining = true",
        "DELETE FROM queueworker.workers",
        "SELECT * FROM queueworker.clean_finished(1, 0, 100)",
        "TRUNCATE queueworker.tasks",
        "SELECT queueworker.enqueue('x')",
        "SELECT * FROM queueworker.task_status(1)",
    )),
    *(("worker", statement) for statement in (
        "UPDATE queueworker.task_events SET detail = NULL",
        "DELETE FROM queueworker.task_events",
        "TRUNCATE queueworker.task_events",
        "DELETE FROM queueworker.tasks",
        "DELETE FROM queueworker.tasks_finished",
        "UPDATE queueworker.tasks_finished SET result = NULL",
        "ALTER TABLE queueworker.task_events DISABLE TRIGGER task_events_append_only",
        "INSERT INTO queueworker.run_events (run_id, to_state, detail) VALUES (1, 'succeeded', '{}')",
        "DELETE FROM queueworker.run_events",
        "UPDATE queueworker.run_events SET detail = '{}'",
        "TRUNCATE queueworker.run_events",
        "UPDATE queueworker.runs SET state = 'succeeded'",
        "INSERT INTO queueworker.watermarks (name, value) VALUES ('w', '1')",
        "SELECT queueworker.enqueue_many('[]')",
        "SELECT * FROM queueworker.task_status(1)",
    )),
    *(("operator", statement) for statement in (
        "INSERT INTO queueworker.tasks (task) VALUES ('x')",
        "UPDATE queueworker.tasks SET payload = '{}'",
        "DELETE FROM queueworker.tasks",
        "INSERT INTO queueworker.task_events (task_id, to_state, lease_token) VALUES (1, 'succeeded', 0)",
        "DELETE FROM queueworker.task_events",
        "SELECT * FROM queueworker.clean_finished(1, 0, 100)",
        "INSERT INTO queueworker.run_events (run_id, to_state, detail) VALUES (1, 'succeeded', '{}')",
        "DELETE FROM queueworker.run_events",
        "UPDATE queueworker.watermarks SET value = '1'",
        "SELECT queueworker.enqueue('x')",
    )),
]


def test_a_producer_copies_without_setting_the_spec_hash_and_without_temp_does_not(installation):
    """A big batch goes through COPY with the producer's grants (TEMPORARY comes from PUBLIC), its
    spec hashes from the trigger; with TEMPORARY revoked it takes the plain insert."""
    installation.install()
    producer_dsn = installation.logins["producer"]
    specs = [{"task": "t", "payload": {"n": n}} for n in range(COPY_THRESHOLD)]
    with psycopg.connect(producer_dsn) as conn:
        assert statements.fetch_one(conn, STAGING_STATE, NO_PARAMS) == (False, True, False), "may stage, may not hash"
        ids = enqueue_many(conn, specs)
        assert conn.execute(STAGED).fetchone()[0]
    with psycopg.connect(installation.admin, autocommit=True) as conn:
        conn.execute(pgsql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC").format(
            pgsql.Identifier(conn.info.dbname)))
    with psycopg.connect(producer_dsn) as conn:
        ids += enqueue_many(conn, specs)
        assert not conn.execute(STAGED).fetchone()[0], "the plain insert, without a staging table"
    hashed = scalar(installation.admin, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) "
                                        "AND spec_hash = queueworker.spec_hash(queue, task, payload)", (ids,))
    assert hashed == 2 * len(specs)


def test_task_keys_need_no_grant_beyond_their_column(installation):
    """A producer login stores keys through every enqueue path (plain, COPY, unique, dependent, a run's
    partitions), an operator login a schedule's key, and a worker login keeps them on a continued
    task's next page and on cron slots, each with only the grants of docs/database-roles.sql."""
    installation.install()
    login = installation.logins
    with psycopg.connect(login["producer"]) as conn:
        plain = enqueue(conn, "long.page", {"page": 0, "pages": 2, "sleep": 0}, queue=QUEUE, key="tenant-a")
        staged = enqueue_many(conn, [{"task": "t", "queue": NOTIFY_QUEUE, "key": f"k{n}"} for n in range(COPY_THRESHOLD)])
        assert conn.execute(STAGED).fetchone()[0], "the batch went through COPY"
        unique = enqueue(conn, "t", queue=NOTIFY_QUEUE, key="tenant-u", dedupe_key="roles-keyed")
        dependent = enqueue(conn, "t", queue=NOTIFY_QUEUE, key="tenant-d", depends_on=[unique])
        run = start_run(conn, "roles-keyed", [{"task": "t", "queue": NOTIFY_QUEUE, "key": "tenant-p"}])
    added = qw("cron", "add", "roles-keyed", "--cron", "* * * * * *", "--task", "qw.noop", "--queue", QUEUE,
               "--key", "tenant-c", "--dsn", login["operator"])
    assert added.returncode == 0, added.stderr
    worker = WorkerProcess(login["worker"], "--queue", QUEUE, "--handlers", "tests.long_task_handlers")
    try:
        wait_until(lambda: scalar(installation.admin, "SELECT count(*) FROM queueworker.tasks WHERE task = 'long.page' "
                                                      "AND state = 'succeeded'") == 2, message="both pages")
        wait_until(lambda: scalar(installation.admin, "SELECT count(*) FROM queueworker.tasks WHERE queue = %s "
                                                      "AND task = 'qw.noop' AND state = 'succeeded'", (QUEUE,)) >= 1,
                   message="a cron slot")
    finally:
        worker.stop()
    assert worker.proc.returncode is not None
    admin = installation.admin
    assert {key for (key,) in query(admin, "SELECT key FROM queueworker.tasks WHERE task = 'long.page'")} == {"tenant-a"}
    assert scalar(admin, "SELECT count(*) FROM queueworker.tasks WHERE task = 'long.page' AND continued_from = %s",
                  (plain,)) == 1
    assert [key for (key,) in query(admin, "SELECT key FROM queueworker.tasks WHERE id = ANY(%s) ORDER BY id",
                                    (staged,))] == [f"k{n}" for n in range(COPY_THRESHOLD)]
    assert query(admin, "SELECT id, key FROM queueworker.tasks WHERE id = ANY(%s) ORDER BY id",
                 ([unique, dependent],)) == [(unique, "tenant-u"), (dependent, "tenant-d")]
    assert scalar(admin, "SELECT key FROM queueworker.tasks WHERE run_id = %s", (run,)) == "tenant-p"
    assert {key for (key,) in query(admin, "SELECT DISTINCT key FROM queueworker.tasks "
                                           "WHERE dedupe_key LIKE 'cron:roles-keyed:%%'")} == {"tenant-c"}


def test_per_key_limits_are_the_operators_and_the_worker_claims_within_them(installation):
    """An operator login sets per-key defaults, a key's own limits, pauses and resumes a key; a worker
    login claims the key-limited queue (CLAIM_KEYS, charging the keys' buckets) and ends a key's timed
    pause once it is over (LOCK_KEYS), each with only the grants of docs/database-roles.sql; neither
    a producer nor a worker login may change a key's settings or the queue's per-key defaults, nor a
    producer touch the claim's state."""
    installation.install()
    login, admin = installation.logins, installation.admin
    for args in (("limit", QUEUE, "--per-key-rate", "50/s", "--per-key-concurrency", "2"),
                 ("limit", QUEUE, "--key", "gold", "--concurrency", "1", "--weight", "2"),
                 ("pause", QUEUE, "--key", "held"), ("resume", QUEUE, "--key", "held"),
                 ("pause", QUEUE, "--key", "later", "--for", "1s")):
        done = qw(*args, "--dsn", login["operator"])
        assert done.returncode == 0, (args, done.stderr)
    with psycopg.connect(login["producer"]) as conn:
        enqueue_many(conn, [{"task": "qw.noop", "queue": QUEUE, "key": key}
                            for key in ("gold", "silver", "later", None) for _ in range(5)])
    worker = WorkerProcess(login["worker"], "--queue", QUEUE)
    try:
        wait_until(lambda: scalar(admin, "SELECT count(*) FROM queueworker.tasks WHERE queue = %s "
                                         "AND state = 'succeeded'", (QUEUE,)) == 20, message="every key's tasks")
    finally:
        worker.stop()
    assert scalar(admin, "SELECT count(*) FROM queueworker.key_state WHERE queue = %s", (QUEUE,)) == 4, "charged"
    assert scalar(admin, "SELECT by_user FROM queueworker.queue_events WHERE change = 'key_resumed' "
                         "ORDER BY id DESC LIMIT 1") == conninfo_to_dict(login["worker"])["user"], \
        "the timed pause, ended by the worker's claim"
    for group in ("producer", "worker"):
        with psycopg.connect(login[group], autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                operations.set_limits(conn, QUEUE, per_key_max_running=100)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                operations.set_limits(conn, QUEUE, key="gold", max_running=100)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                operations.pause(conn, QUEUE, key="silver")
            for statement in ("UPDATE queueworker.queue_keys SET max_running = 100",
                              "DELETE FROM queueworker.queue_keys",
                              "UPDATE queueworker.queues SET key_max_running = 100, key_limits = false",
                              "DELETE FROM queueworker.key_state"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
    with psycopg.connect(login["producer"], autocommit=True) as conn:
        for statement in ("UPDATE queueworker.key_state SET tokens = 1000",
                          "SELECT queueworker.lock_key_limited_queue('roles')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


def test_per_key_breakers_are_the_operators_and_the_worker_keeps_them_and_the_keys_health(installation):
    """An operator login sets and removes a per-key breaker; a worker login claims the queue, reports
    its keys' outcomes (health, a key's breaker opened by its failures) and probes the open key,
    each with only the grants of docs/database-roles.sql; neither a producer nor a worker login may
    set the breaker, nor a producer write the keys' state, nor an operator write the keys' health."""
    installation.install()
    login, admin = installation.logins, installation.admin
    done = qw("breaker", QUEUE, "--per-key", "--failures", "1", "--cooldown", "1s", "--dsn", login["operator"])
    assert done.returncode == 0, done.stderr
    with psycopg.connect(login["producer"]) as conn:
        enqueue_many(conn, [{"task": "qw.noop", "queue": QUEUE, "key": key} for key in ("ok", None) for _ in range(3)]
                     + [{"task": "qw.fail", "queue": QUEUE, "key": "bad", "payload": {"retryable": False}}
                        for _ in range(2)])
    worker = WorkerProcess(login["worker"], "--queue", QUEUE, "--concurrency", "1")
    try:
        wait_until(lambda: scalar(admin, "SELECT count(*) FROM queueworker.tasks WHERE queue = %s "
                                         "AND state IN ('succeeded', 'failed')", (QUEUE,)) == 8,
                   message="every task, the failing key's second as its probe")
        changes = ["key_breaker_open", "key_breaker_half_open", "key_breaker_open"]
        wait_until(lambda: [change for change, in query(admin, "SELECT change FROM queueworker.queue_events WHERE "
                                                               "change LIKE 'key_breaker%%' ORDER BY id")][:3] == changes,
                   message="the probe's failure reported: the breaker open again")
    finally:
        worker.stop()
    assert dict(query(admin, "SELECT key, failure_streak FROM queueworker.key_state WHERE queue = %s",
                      (QUEUE,))) == {"ok": 0, "": 0, "bad": 2}
    for group in ("producer", "worker"):
        with psycopg.connect(login[group], autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                operations.set_breaker(conn, QUEUE, failures=100, cooldown_seconds=1, per_key=True)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("UPDATE queueworker.queues SET key_breaker_failures = NULL, "
                             "key_breaker_cooldown_seconds = NULL")
    with psycopg.connect(login["producer"], autocommit=True) as conn:
        for statement in ("UPDATE queueworker.key_state SET breaker_state = 'closed'",
                          "SELECT queueworker.lock_key_limited_queue('roles', true)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with psycopg.connect(login["operator"], autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE queueworker.key_state SET failure_streak = 0")
        operations.set_breaker(conn, QUEUE, failures=None, per_key=True)
    assert scalar(admin, "SELECT count(*) FROM queueworker.key_state WHERE breaker_state <> 'closed'") == 0


def test_each_role_is_refused_what_it_does_not_need(installation):
    installation.install()
    with psycopg.connect(installation.admin, autocommit=True) as conn:
        enqueue(conn, "qw.noop")
    allowed = []
    for group, statement in REFUSED:
        with psycopg.connect(installation.logins[group], autocommit=True) as conn:
            try:
                conn.execute(statement)
            except psycopg.errors.InsufficientPrivilege:
                continue
            allowed.append((group, statement))
    assert allowed == []
    events = scalar(installation.admin, "SELECT count(*) FROM queueworker.task_events")
    assert events == 1, "the one enqueue's audit row, untouched"


def test_truncating_the_audit_trails_is_refused_even_to_their_owner(installation):
    installation.install()
    with psycopg.connect(installation.logins["migrator"], autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("queueworker_migrator",)
        for table in ("task_events", "run_events"):
            with pytest.raises(psycopg.errors.RaiseException, match=f"queueworker.{table} is an append-only"):
                conn.execute(f"TRUNCATE queueworker.{table}")


def test_definer_functions_pin_their_search_path_and_are_not_public(dsn):
    definers = query(dsn, "SELECT proname, proconfig FROM pg_proc "
                          "WHERE pronamespace = 'queueworker'::regnamespace AND prosecdef")
    pinned = ["search_path=pg_catalog, pg_temp"]
    # The lock of a key-limited queue's claims also asks for generic plans (tests/test_nested_plans.py),
    # made without sequential scans (tests/test_stale_plans.py), as the producer's insert and its lookup
    # of the tasks holding keys, the start of a run, the settling of dependents and the counting of
    # runs and the retention are planned (the versions of enqueue_tasks, settle_dependents and
    # clean_finished for older callers call the newest; start_run's for older producers looks nothing up).
    without_seqscan = [*pinned, "enable_seqscan=off"]
    also = {"lock_key_limited_queue": [pinned, [*pinned, "plan_cache_mode=force_generic_plan", "enable_seqscan=off"]],
            "enqueue_tasks": [pinned, without_seqscan], "existing_tasks": [without_seqscan],
            "start_run": [pinned, without_seqscan], "settle_dependents": [pinned, without_seqscan],
            "settle_new_dependent": [without_seqscan], "count_run_outcomes": [without_seqscan],
            "clean_finished": [pinned, without_seqscan], **dict.fromkeys(
                ("clean_runs", "clean_queue_events", "clean_watermarks", "clean_key_state"), [without_seqscan])}
    assert [(name, config) for name, config in definers if config not in also.get(name, [pinned])] == []
    assert {name for name, _ in definers} == {"audit_task_inserts", "audit_task_updates", "clean_finished",
        "clean_runs", "clean_queue_events", "clean_watermarks", "clean_key_state", "enqueue_tasks",
        "replace_pending", "settle_dependents", "settle_new_dependent", "count_run_outcomes", "start_run",
        "finalize_run", "audit_run", "audit_queue", "unbound_by_grants", "queue_patterns", "grant_queue",
        "revoke_queue", "mark_notify_on_finish", "existing_tasks", "fair_tag_inserts", "fair_tag_updates",
        "audit_queue_key", "enqueue", "enqueue_many", "task_status", "note_key_limits", "key_limited_queue_keyed",
        "retag_resumed_key", "lock_key_limited_queue", "key_capacity", "refuse_claims_blind_to_key_limits",
        "audit_key_breaker"}
    # Even without docs/database-roles.sql, only the owner may run the functions that change rows.
    for function in ("clean_finished(bigint, float8, integer)", "clean_finished(float8, integer)",
                     "clean_runs(float8, integer)", "clean_queue_events(float8, integer)",
                     "clean_watermarks(float8, integer)", "clean_key_state(float8, integer)",
                     "retention_cutoff(float8, integer)",
                     "enqueue_tasks(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[], text[], "
                     "boolean[], boolean[], bigint[], bigint[], bigint[], integer[])",
                     "count_run_outcomes(bigint[], bigint[], integer[], text[], text[])",
                     "start_run(text, integer, jsonb, jsonb, text)", "finalize_run(bigint)",
                     "start_run(text, integer, jsonb, jsonb, text, text[])", "grant_queue(text, text)",
                     "revoke_queue(text, text)", "mark_notify_on_finish(bigint[])", "queue_patterns()",
                     "existing_tasks(bigint[], text[], text[])",
                     "replace_pending(bigint[], jsonb[], integer[], timestamptz[])",
                     "settle_dependents(bigint[], bigint[])", "settle_dependents(bigint[])", "audit_run()",
                     "audit_queue()", "tag_fair(bigint[], bigint[])", "fair_tag_inserts()", "fair_tag_updates()",
                     "audit_queue_key()", "enqueue_many(jsonb)", "task_status(bigint)", "make_keyed(text[])",
                     "note_key_limits()", "key_limited_queue_keyed()", "retag_resumed_key()",
                     "lock_key_limited_queue(text)", "refuse_claims_blind_to_key_limits()",
                     "lock_key_limited_queue(text, boolean)", "audit_key_breaker()",
                     "key_capacity(text, integer, float8)",
                     "enqueue(text, jsonb, text, bigint, timestamptz, double precision, bigint, bigint, text, text, "
                     "text, text, bigint[], text, jsonb, boolean)"):
        assert scalar(dsn, "SELECT bool_or(grantee = 0) FROM pg_proc, aclexplode(proacl) "
                           f"WHERE oid = 'queueworker.{function}'::regprocedure") is False, function


def test_the_script_decides_on_every_object_of_the_schema(dsn):
    """A migration that adds a table, partition, type or function must add its grants to the script
    (or say there why it needs none) in the same release."""
    objects = query(dsn, """
        SELECT relname FROM pg_class WHERE relnamespace = 'queueworker'::regnamespace AND relkind IN ('r', 'p')
        UNION SELECT proname FROM pg_proc WHERE pronamespace = 'queueworker'::regnamespace
        UNION SELECT typname FROM pg_type WHERE typnamespace = 'queueworker'::regnamespace AND typtype = 'e'""")
    script = SCRIPT.read_text()
    assert [name for (name,) in objects if f"queueworker.{name}" not in script] == []
    assert f"schema version {available_migrations()[-1].version}" in script


def test_an_installation_migrated_before_the_roles_passes_to_the_migrator(installation):
    """In the field the schema was migrated by whoever ran `queueworker migrate` (here the
    superuser, up to version 2). The script hands everything to the migrator, which then
    upgrades it; the roles work from there."""
    admin = installation.admin
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP SCHEMA queueworker")  # the fixture's run of the script made it; the field had none
        migrate_to(admin, 2)
        # A task of that time, inserted as that version's producer did (this one's needs version 19).
        old = conn.execute("INSERT INTO queueworker.tasks (queue, task) VALUES ('default', 'qw.noop') "
                           "RETURNING id").fetchone()[0]
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() - interval '2 hours'")
    assert [row[0] for row in query(admin, OWNERS)] == ["postgres"]

    installation.install()

    assert [row[0] for row in query(admin, OWNERS)] == ["queueworker_migrator"]
    with psycopg.connect(installation.logins["producer"]) as conn:
        new = enqueue(conn, "qw.noop")
    assert query(admin, "SELECT from_state, to_state::text FROM queueworker.task_events WHERE task_id = %s",
                 (new,)) == [(None, "pending")]
    assert asyncio.run(_clean(installation.logins["worker"])) == 1
    assert sorted(row[0] for row in query(admin, "SELECT id FROM queueworker.tasks")) == [new]
    assert old not in {row[0] for row in query(admin, "SELECT task_id FROM queueworker.task_events")}

"""Queue grants, for real: two producer logins of docs/database-roles.sql share one database, an
operator grants each its queues with the real `queueworker grant`, and neither can then enqueue into,
read, replace, depend on, lock or add to the runs and watermarks of the other's queues, while a real
worker process (a worker login) runs both tenants' tasks. Before the first grant nothing is limited."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql as pgsql

from queueworker.client import grants
from queueworker.client.operations import cancel
from queueworker.client.producer import COPY_THRESHOLD, TaskSpec, enqueue, enqueue_many, start_run
from queueworker.db import statements
from queueworker.db.runs import START_RUN, StartRunParams
from tests.support import FAST_LEASES, WorkerProcess, assert_each_succeeded_once, query, scalar, wait_until
from tests.test_roles import Installation, installation, qw  # noqa: F401 (installation: a fixture)

pytestmark = pytest.mark.integration

DENIED = psycopg.errors.InsufficientPrivilege


@contextmanager
def tenants(installation: Installation, *names: str) -> Iterator[dict[str, str]]:
    """A producer login per name (members of queueworker_producer, as docs/database-roles.sql shows)."""
    logins, roles = {}, []
    with psycopg.connect(installation.admin, autocommit=True) as conn:
        for name in names:
            role, password = f"{name}_{secrets.token_hex(3)}", secrets.token_urlsafe(18)
            conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE queueworker_producer").format(
                pgsql.Identifier(role), pgsql.Literal(password)))
            roles.append(role)
            logins[name] = psycopg.conninfo.make_conninfo(installation.admin, user=role, password=password)
    try:
        yield logins
    finally:
        with psycopg.connect(installation.admin, autocommit=True) as conn:
            for role in roles:
                conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))


def user(dsn: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(dsn)["user"]


def add_partition(conn: psycopg.Connection, run: int, partition: int, queue: str) -> None:
    """Enqueues one partition of a run, as start_run does, through the producer's definer function."""
    conn.execute("SELECT * FROM queueworker.enqueue_tasks(ARRAY[%s], ARRAY['qw.noop'], ARRAY['{}'::jsonb], ARRAY[0], "
                 "ARRAY[NULL::timestamptz], ARRAY[10], ARRAY[NULL::int], ARRAY[NULL], ARRAY[false], ARRAY[false], "
                 "'{}', '{}', ARRAY[%s::bigint], ARRAY[%s::int], ARRAY[NULL::jsonb])", (queue, run, partition))


def as_operator(installation: Installation, *args: str) -> str:
    """`queueworker grant|revoke|grants|show ...` as the operator login, in a real process."""
    done = qw(*args, "--dsn", installation.logins["operator"])
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_before_the_first_grant_every_producer_uses_every_queue(installation):
    installation.install()
    with tenants(installation, "billing") as logins, psycopg.connect(logins["billing"], autocommit=True) as conn:
        ids = [enqueue(conn, "qw.noop", queue="shipping.labels"), enqueue(conn, "qw.noop", queue="anything")]
        ids += enqueue_many(conn, [TaskSpec(task="qw.noop", queue="shipping.labels", dedupe_key="k")])
    assert [row[0] for row in query(installation.admin, "SELECT id FROM queueworker.tasks ORDER BY id")] == ids
    assert as_operator(installation, "grants") == "no queue grants: every producer may use every queue\n"


def test_each_producer_touches_only_the_queues_it_is_granted(installation):
    installation.install()
    with tenants(installation, "billing", "shipping") as logins:
        billing, shipping = logins["billing"], logins["shipping"]
        # Shipping's work from before the grants: a pending unique task, and a run that advanced a watermark.
        with psycopg.connect(shipping) as conn:
            theirs = enqueue(conn, "qw.noop", {"label": 1}, queue="shipping.labels", dedupe_key="label-1",
                             delay=3600)
            start_run(conn, "labels", [{"task": "qw.noop", "queue": "shipping.labels"}], watermark="labels")
            # A run of two partitions of which only the first is enqueued yet.
            open_run = statements.fetch(conn, START_RUN, StartRunParams(
                name="open", expected=2, on_success=None, on_failure=None, watermark=None,
                queues=["shipping.labels"]))[0].id
            add_partition(conn, open_run, 0, "shipping.labels")
            conn.commit()
        assert "may use queues matching shipping.*" in as_operator(installation, "grant", user(shipping), "--queue",
                                                             "shipping.*")
        as_operator(installation, "grant", user(billing), "--queue", "billing.*")
        as_operator(installation, "grant", user(billing), "--queue", "invoices-??")
        assert "(it already could)" in as_operator(installation, "grant", user(billing), "--queue", "billing.*")
        listed = as_operator(installation, "grants")
        assert f"{user(billing)}" in listed and "invoices-??" in listed and "shipping.*" in listed

        worker = WorkerProcess(installation.logins["worker"], "--queue", "billing.eu", "--queue", "invoices-01",
                               "--queue", "shipping.labels", "--concurrency", "4", *FAST_LEASES)
        try:
            with psycopg.connect(billing, autocommit=True) as conn:
                mine = [enqueue(conn, "qw.noop", queue="billing.eu"), enqueue(conn, "qw.noop", queue="invoices-01")]
                mine += enqueue_many(conn, [TaskSpec(task="qw.noop", queue="billing.eu", dedupe_key="b-1"),
                                            TaskSpec(task="qw.noop", queue="billing.eu", depends_on=[mine[0]])])
                # A duplicate finds the task holding its key (through queueworker.existing_tasks).
                assert enqueue(conn, "qw.noop", queue="billing.eu", dedupe_key="b-1") == mine[2]
                # The staged (COPY) path of a big batch passes the same check.
                mine += enqueue_many(conn, [TaskSpec(task="qw.noop", queue="billing.eu", payload={"n": n})
                                            for n in range(COPY_THRESHOLD)])

                # Enqueueing into another's queue, by every path, is refused and leaves nothing behind.
                for attempt in (lambda: enqueue(conn, "qw.noop", queue="shipping.labels"),
                                lambda: enqueue(conn, "qw.noop", queue="invoices-001"),
                                lambda: enqueue_many(conn, [TaskSpec(task="qw.noop", queue="billing.eu"),
                                                            TaskSpec(task="qw.noop", queue="shipping.labels")]),
                                lambda: enqueue_many(conn, [TaskSpec(task="qw.noop", queue="shipping.labels",
                                                                     payload={"n": n})
                                                            for n in range(COPY_THRESHOLD)]),
                                lambda: enqueue(conn, "qw.noop", queue="shipping.labels", dedupe_key="label-1",
                                                on_conflict="replace"),
                                # With keys: the statements and the definer function that store them.
                                lambda: enqueue(conn, "qw.noop", queue="shipping.labels", key="k"),
                                lambda: enqueue(conn, "qw.noop", queue="shipping.labels", key="k", dedupe_key="k-1"),
                                lambda: enqueue_many(conn, [TaskSpec(task="qw.noop", queue="shipping.labels",
                                                                     key=f"k{n}") for n in range(COPY_THRESHOLD)])):
                    with pytest.raises(DENIED):
                        attempt()
                # It reads no task, not even the ids, queues and due times of its own (only an insert's
                # RETURNING shows those, of the rows it inserts), and cannot lock another's row.
                for column in ("id", "queue", "run_after", "state", "dedupe_key", "key", "payload"):
                    with pytest.raises(DENIED):
                        conn.execute(f"SELECT {column} FROM queueworker.tasks WHERE id = %s", (theirs,))
                assert conn.execute("SELECT id, queue, run_after FROM queueworker.new_tasks").fetchall() == []
                with pytest.raises(DENIED):
                    conn.execute("SELECT id FROM queueworker.tasks WHERE id = %s FOR UPDATE", (theirs,))
                with pytest.raises(DENIED):
                    conn.execute("SELECT id FROM queueworker.new_tasks FOR UPDATE")
                with pytest.raises(DENIED, match="may not use queue shipping.labels"):
                    conn.execute("SELECT * FROM queueworker.existing_tasks(ARRAY[1::bigint], ARRAY['shipping.labels'], "
                                 "ARRAY['label-1'])")
                # Nor depend on it: to this login it does not exist.
                with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"there is no task {theirs} to"):
                    enqueue(conn, "qw.noop", queue="billing.eu", depends_on=[theirs])
                with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"there is no task {theirs} to"):
                    enqueue(conn, "qw.noop", queue="billing.eu", depends_on=[theirs], key="k")
                # Nor replace it through the definer function, which the CLI never calls this way: to this
                # login it does not exist, as an unknown id does not.
                assert conn.execute("SELECT * FROM queueworker.replace_pending(ARRAY[%s::bigint], "
                                    "ARRAY['{\"label\": \"forged\"}'::jsonb], ARRAY[2147483647], "
                                    "ARRAY[now()])", (theirs,)).fetchall() == []
                # Nor add a partition to its run (one it left open), nor run over its watermark.
                with pytest.raises(psycopg.errors.CheckViolation,
                                   match=f"not a partition its run can count: run {open_run}, partition 1"):
                    add_partition(conn, open_run, 1, "billing.eu")
                with pytest.raises(DENIED, match="may not use queue shipping.labels"):
                    add_partition(conn, open_run, 1, "shipping.labels")
                with pytest.raises(DENIED, match="may not use the watermark labels"):
                    start_run(conn, "mine", [{"task": "qw.noop", "queue": "billing.eu"}], watermark="labels")
                with pytest.raises(DENIED, match="may not start a run without naming its queues"):
                    conn.execute("SELECT queueworker.start_run('old', 1, NULL, NULL, NULL)")
                with pytest.raises(DENIED, match="may not use queue shipping.labels"):
                    start_run(conn, "mine", [{"task": "qw.noop", "queue": "billing.eu"}],
                              on_failure={"task": "qw.noop", "queue": "shipping.labels"})
                # wait_for's mark goes through a definer function: its own tasks only.
                mine.append(enqueue(conn, "qw.noop", queue="billing.eu", notify_on_finish=True))
                assert conn.execute("SELECT queueworker.mark_notify_on_finish(ARRAY[%s::bigint])",
                                    (theirs,)).fetchall() == []

            # Shipping's own work goes on: its run and watermark are its to move.
            with psycopg.connect(shipping, autocommit=True) as conn:
                again = start_run(conn, "labels", [{"task": "qw.noop", "queue": "shipping.labels"}],
                                  watermark="labels")
                add_partition(conn, open_run, 1, "shipping.labels")
            assert scalar(installation.admin, "SELECT payload FROM queueworker.tasks WHERE id = %s", (theirs,)) == {
                "label": 1}
            wait_until(lambda: scalar(installation.admin, "SELECT count(*) FROM queueworker.runs "
                                                          "WHERE state = 'succeeded'") == 3, message="the runs")
            wait_until(lambda: scalar(installation.admin, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) "
                                                          "AND state = 'succeeded'", (mine,)) == len(set(mine)),
                       message="billing's tasks")
            assert_each_succeeded_once(installation.admin, sorted(set(mine)))
            assert query(installation.admin, "SELECT queues FROM queueworker.runs WHERE id = %s", (again,)) == [
                (["shipping.labels"],)]
        finally:
            worker.stop()

        # Each audit row names the login that acted.
        actors = dict(query(installation.admin, "SELECT to_state::text || ':' || task_id, by_user "
                                                "FROM queueworker.task_events WHERE task_id = ANY(%s)",
                            ([mine[0], theirs],)))
        assert actors[f"pending:{mine[0]}"] == user(billing)
        assert actors[f"pending:{theirs}"] == user(shipping)
        assert actors[f"succeeded:{mine[0]}"] == user(installation.logins["worker"])
        with psycopg.connect(installation.logins["operator"], autocommit=True) as conn:
            assert cancel(conn, theirs, reason="done with it")
        assert scalar(installation.admin, "SELECT by_user FROM queueworker.task_events WHERE task_id = %s "
                                          "AND to_state = 'cancelled'", (theirs,)) == user(installation.logins["operator"])
        shown = as_operator(installation, "show", str(theirs))  # what `queueworker show` prints of the audit trail
        assert f"(by {user(shipping)})" in shown and f"(by {user(installation.logins['operator'])})" in shown

        # Revoking takes exactly that pattern away.
        assert "revoked" in as_operator(installation, "revoke", user(billing), "--queue", "invoices-??")
        assert "nothing revoked" in as_operator(installation, "revoke", user(billing), "--queue", "invoices-??")
        with psycopg.connect(billing, autocommit=True) as conn:
            with pytest.raises(DENIED):
                enqueue(conn, "qw.noop", queue="invoices-01")
            enqueue(conn, "qw.noop", queue="billing.eu")


def test_a_grant_to_a_group_applies_to_its_members_and_other_producers_get_none(installation):
    installation.install()
    with tenants(installation, "payments", "refunds", "outsider") as logins:
        with psycopg.connect(installation.admin, autocommit=True) as conn:
            conn.execute("DROP ROLE IF EXISTS qw_test_finance")
            conn.execute("CREATE ROLE qw_test_finance NOLOGIN")
            for name in ("payments", "refunds"):
                conn.execute(pgsql.SQL("GRANT qw_test_finance TO {}").format(pgsql.Identifier(user(logins[name]))))
        try:
            as_operator(installation, "grant", "qw_test_finance", "--queue", "finance.*")
            for name in ("payments", "refunds"):
                with psycopg.connect(logins[name], autocommit=True) as conn:
                    enqueue(conn, "qw.noop", queue=f"finance.{name}")
            with psycopg.connect(logins["outsider"], autocommit=True) as conn:
                with pytest.raises(DENIED, match="may not use queue finance.payments"):
                    enqueue(conn, "qw.noop", queue="finance.payments")
            # The logins that run queueworker are not bound: the operator sees and the worker claims all.
            assert scalar(installation.logins["operator"], "SELECT count(*) FROM queueworker.tasks") == 2
        finally:
            with psycopg.connect(installation.admin, autocommit=True) as conn:
                conn.execute("DELETE FROM queueworker.queue_grants WHERE grantee = 'qw_test_finance'")
                conn.execute("DROP ROLE qw_test_finance")


def test_queue_grants_leave_the_other_roles_plans_alone(installation):
    """Not row-level security: with it on, Postgres plans every other role's statements on tasks
    without the statistics of non-leakproof operators (the state enum's `=`), which made the
    controller's depth read of 800,000 tasks four times slower. The insert trigger and the definer
    functions check producers instead."""
    installation.install()
    assert query(installation.admin, "SELECT relrowsecurity, relforcerowsecurity FROM pg_class "
                                      "WHERE relnamespace = 'queueworker'::regnamespace AND relrowsecurity") == []


def test_a_consolidation_the_run_could_not_enqueue_is_refused_at_its_start(installation):
    installation.install()
    with psycopg.connect(installation.logins["producer"], autocommit=True) as conn:
        for spec in ('{"task": "t", "queue": "bad queue!"}', '{"task": ""}', '{"task": "t", "max_attempts": 0}',
                     '{"task": "t", "priority": 1.5}', '{"task": "t", "timeout_seconds": "x"}', '[1]'):
            with pytest.raises(psycopg.errors.CheckViolation, match="the run's consolidation is not a task spec"):
                conn.execute("SELECT queueworker.start_run('r', 1, %s::jsonb, NULL, NULL, ARRAY['q'])", (spec,))
        conn.execute("SELECT queueworker.start_run('r', 1, '{\"task\": \"t\", \"priority\": 5}', NULL, NULL, "
                     "ARRAY['q'])")


def test_grant_refuses_bad_input_in_one_line(installation):
    installation.install()
    with pytest.raises(ValueError, match="a queue pattern is 1 to 128"):
        grants.grant_queue(None, "producer", "billing/*")  # type: ignore[arg-type] - refused before any round trip
    with pytest.raises(ValueError, match=r"a role name is 1 to 63 characters, not 'pro\\x00ducer'"):
        grants.revoke_queue(None, "pro\x00ducer", "billing.*")  # type: ignore[arg-type] - no process takes a NUL
    for args, message in ((("grant", "nobody_at_all", "--queue", "x"), "there is no role nobody_at_all"),
                          (("grant", "queueworker_producer", "--queue", "a%b"), "a queue pattern is 1 to 128"),
                          (("grant", "queueworker_producer", "--queue", "x" * 129), "a queue pattern is 1 to 128"),
                          (("revoke", "", "--queue", "x"), "a role name is 1 to 63")):
        done = qw(*args, "--dsn", installation.logins["operator"])
        assert done.returncode != 0 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    # A producer may not grant itself more.
    done = qw("grant", "queueworker_producer", "--queue", "*", "--dsn", installation.logins["producer"])
    assert done.returncode == 1 and "permission denied for function grant_queue" in done.stderr, done.stderr


def test_a_run_of_no_queue_cannot_take_another_producers_watermark(installation):
    """start_run with queues that are all NULL declared no queue, so the grants' check passed even for a
    login granted none, and its run owned the watermark it named: the tenant whose name it was could
    never start a run over it."""
    installation.install()
    with tenants(installation, "billing", "squatter") as logins:
        as_operator(installation, "grant", user(logins["billing"]), "--queue", "billing.*")
        with psycopg.connect(logins["squatter"], autocommit=True) as conn:  # no grant at all
            for queues in ("{NULL}", "{NULL,NULL}"):
                with pytest.raises(psycopg.errors.NullValueNotAllowed, match="none of them NULL"):
                    conn.execute("SELECT queueworker.start_run('squat', 1, NULL, NULL, 'nightly-invoices', %s)",
                                 (queues,))
        with psycopg.connect(logins["billing"], autocommit=True) as conn:
            start_run(conn, "invoices", [{"task": "qw.noop", "queue": "billing.eu"}], watermark="nightly-invoices")
        assert scalar(installation.admin, "SELECT count(*) FROM queueworker.runs WHERE queues IS NULL") == 0

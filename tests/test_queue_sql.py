"""Integration: the producer API and the fenced SQL transitions, against a real Postgres."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from queueworker.db import depth, duties, lease, statements
from queueworker.db.migrate import available_migrations
from queueworker.client.producer import TaskSpec, enqueue, enqueue_many
from tests.support import query, scalar

pytestmark = pytest.mark.integration

CLAIM_DEFAULTS = {"lease_seconds": 30, "timeout_seconds": 60}


def _claim(conn, worker, limit=10, queue="default"):
    return statements.fetch(conn, lease.CLAIM, lease.ClaimParams(queue=queue, limit=limit, worker=worker,
                                                                 **CLAIM_DEFAULTS))


def test_enqueue_joins_the_callers_transaction(dsn):
    with psycopg.connect(dsn) as conn:
        enqueue(conn, "qw.noop")
        conn.rollback()
        kept = enqueue(conn, "qw.noop", {"a": 1}, queue="mail", priority=5)
        conn.commit()
    assert query(dsn, "SELECT id, queue, priority, payload FROM queueworker.tasks") == [(kept, "mail", 5, {"a": 1})]


def test_batch_enqueue_keeps_order_and_wakes_each_queue_once(dsn):
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN queueworker")
        with psycopg.connect(dsn) as conn:
            specs = [{"task": "qw.noop", "payload": {"i": i}, "queue": "a" if i % 2 else "b"} for i in range(12000)]
            ids = enqueue_many(conn, specs)
        notes = [n.payload for n in listener.notifies(timeout=1.0)]
    assert ids == sorted(ids) and len(ids) == 12000
    assert [p["i"] for (p,) in query(dsn, "SELECT payload FROM queueworker.tasks ORDER BY id")] == list(range(12000))
    # 12000 rows in 3 statements of one transaction: Postgres folds identical notifications,
    # so each queue is woken once.
    assert sorted(notes) == ["a", "b"]


def test_delayed_batch_notifies_its_due_time(dsn):
    due = datetime.now(timezone.utc) + timedelta(seconds=30)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN queueworker")
        with psycopg.connect(dsn) as conn:
            enqueue(conn, "qw.noop", run_after=due)
        (note,) = [n.payload for n in listener.notifies(timeout=1.0)]
    queue, epoch = note.split(" ")
    assert queue == "default" and abs(float(epoch) - due.timestamp()) < 0.01
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _claim(conn, uuid.uuid4()) == [], "a delayed task must not be claimable yet"


@pytest.mark.parametrize("spec, message", [
    ({"task": ""}, "at least 1 character"),
    ({"task": "t", "queue": "no spaces"}, "should match pattern"),
    ({"task": "t", "payload": {"x": object()}}, "not JSON-serialisable"),
    ({"task": "t", "max_attempts": 0}, "greater than or equal to 1"),
    ({"task": "t", "delay": 1, "run_after": datetime.now(timezone.utc)}, "not both"),
    ({"task": "t", "run_after": datetime.now()}, "timezone-aware"),
])
def test_bad_specs_fail_before_the_database(spec, message):
    with pytest.raises(ValidationError, match=message):
        TaskSpec(**spec)


def test_claim_order_is_priority_then_age_and_skips_locked_rows(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        low = enqueue(conn, "qw.noop")
        high = enqueue(conn, "qw.noop", priority=10)
        later = enqueue(conn, "qw.noop")
        with psycopg.connect(dsn) as other:
            other.execute("SELECT 1 FROM queueworker.tasks WHERE id = %s FOR UPDATE", (high,))
            assert [r[0] for r in _claim(conn, uuid.uuid4(), limit=1)] == [low]
        assert [r[0] for r in _claim(conn, uuid.uuid4(), limit=5)] == [high, later]


def test_every_transition_out_of_running_is_fenced_by_the_lease_token(dsn):
    """A worker whose lease was rescued and re-claimed can change nothing any more."""
    old_worker, new_worker = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "qw.noop")
        old_token = _claim(conn, old_worker)[0].lease_token
        conn.execute("UPDATE queueworker.tasks SET leased_until = now() - interval '1 second' WHERE id = %s",
                     (task_id,))
        (held, requeued, failed, _, _), = statements.fetch(conn, duties.RESCUE, duties.RescueParams(
            deadline_grace=60, worker_ttl=60, limit=100))
        assert (held, requeued, failed) == (True, 1, 0)
        new_claim, = _claim(conn, new_worker)
        attempt, new_token = new_claim.attempts, new_claim.lease_token
        assert (attempt, new_token) == (2, old_token + 1)
        stale = {"ids": [task_id], "tokens": [old_token]}
        heartbeat = dict(stale, worker=old_worker, hostname="h", pod_name=None, pod_namespace=None, pid=1,
                         queues=["default"], concurrency=1, running=1, draining=False, version="t", lease_seconds=30,
                         progresses=[None])
        assert statements.fetch(conn, lease.HEARTBEAT, lease.HeartbeatParams(**heartbeat)) == []
        assert statements.fetch(conn, lease.COMPLETE_SUCCEEDED,
                                lease.CompleteSucceededParams(**stale, results=['"late"'])) == []
        assert statements.fetch(conn, lease.COMPLETE_FAILED, lease.CompleteFailedParams(
            **stale, retryables=[True], backoffs=[1.0], errors=[Jsonb({"message": "late"})])) == []
        assert statements.fetch(conn, lease.RELEASE, lease.DeregisterWorkerParams(worker=old_worker)) == [], \
            "the old worker holds nothing"
        assert query(dsn, "SELECT state::text, lease_owner, lease_token, rescues FROM queueworker.tasks") == [
            ("running", new_worker, new_token, 1)]
        assert statements.fetch(conn, lease.COMPLETE_SUCCEEDED, lease.CompleteSucceededParams(
            ids=[task_id], tokens=[new_token], results=['"ok"'])) == [(task_id, new_token)]
    assert scalar(dsn, "SELECT result FROM queueworker.tasks") == "ok"


def test_a_heartbeat_keeps_reporting_a_lease_past_its_deadline_but_stops_extending_it(dsn):
    worker = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue(conn, "qw.noop")
        claimed, = _claim(conn, worker)
        task_id, token = claimed.id, claimed.lease_token
        beat = lease.HeartbeatParams(worker=worker, hostname="h", pod_name=None, pod_namespace=None, pid=1,
                                     queues=["default"], concurrency=1, running=1, draining=False, version="t",
                                     lease_seconds=30, ids=[task_id], tokens=[token], progresses=[None])
        assert statements.fetch(conn, lease.HEARTBEAT, beat) == [(task_id, token, True)]
        conn.execute("UPDATE queueworker.tasks SET deadline_at = now() - interval '1 second', "
                     "leased_until = now() + interval '5 seconds' WHERE id = %s", (task_id,))
        leased_until = scalar(dsn, "SELECT leased_until FROM queueworker.tasks WHERE id = %s", (task_id,))
        assert statements.fetch(conn, lease.HEARTBEAT, beat) == [(task_id, token, False)]
        assert scalar(dsn, "SELECT leased_until FROM queueworker.tasks WHERE id = %s", (task_id,)) == leased_until


def test_rescue_fails_a_task_whose_attempts_are_spent(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "qw.noop", max_attempts=1)
        _claim(conn, uuid.uuid4())
        conn.execute("UPDATE queueworker.tasks SET leased_until = now() - interval '1 second'")
        statements.fetch(conn, duties.RESCUE, duties.RescueParams(deadline_grace=60,
                                                                  worker_ttl=60, limit=100))
    state, error = query(dsn, "SELECT state::text, error FROM queueworker.tasks WHERE id = %s", (task_id,))[0]
    assert state == "failed" and error["type"] == "LeaseExpired" and "lease expired" in error["message"]


def test_audit_log_is_append_only(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue(conn, "qw.noop")
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute("UPDATE queueworker.task_events SET to_state = 'failed'")


def test_two_concurrent_migrations_both_succeed(blank_dsn):
    procs = [subprocess.Popen([sys.executable, "-m", "queueworker.cli", "migrate", "--dsn", blank_dsn],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=60) + (p.returncode,) for p in procs]
    assert [r[2] for r in results] == [0, 0], results
    assert sorted("001_initial" in r[0] for r in results) == [False, True], "exactly one applied it"
    assert scalar(blank_dsn, "SELECT count(*) FROM queueworker.schema_migrations") == len(available_migrations())


def test_cleaner_deletes_only_finished_history_past_the_retention(dsn):
    import asyncio

    from queueworker.runtime.cleaner import Cleaner
    from queueworker.db.connection import DutyConnection

    with psycopg.connect(dsn, autocommit=True) as conn:
        old_done, old_failed, fresh_done, waiting = (enqueue(conn, "qw.noop") for _ in range(4))
        conn.execute("""UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() - interval '2 hours'
                        WHERE id = %s""", (old_done,))
        conn.execute("""UPDATE queueworker.tasks SET state = 'failed', finished_at = now() - interval '2 hours'
                        WHERE id = %s""", (old_failed,))
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() WHERE id = %s",
                     (fresh_done,))

    async def clean() -> int:
        connection = DutyConnection(dsn, "test")
        try:
            return (await Cleaner(connection, retention_seconds=3600, watermark_retention_seconds=0,
                                  interval=1).clean_once()).tasks
        finally:
            await connection.close()

    assert asyncio.run(clean()) == 2
    assert sorted(r[0] for r in query(dsn, "SELECT id FROM queueworker.tasks")) == [fresh_done, waiting]
    assert sorted({r[0] for r in query(dsn, "SELECT task_id FROM queueworker.task_events")}) == [fresh_done, waiting]


def test_worker_leases_count_leases_taken_since_the_last_heartbeat(dsn):
    worker = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""INSERT INTO queueworker.workers (id, hostname, pod_name, pod_namespace, pid, queues,
                        concurrency, running, version) VALUES (%s, 'h', 'pod-a', 'ns', 1, '{default}', 5, 0, 't')""",
                     (worker,))
        enqueue(conn, "qw.noop")
        enqueue(conn, "qw.noop")
        _claim(conn, worker)
        rows = statements.fetch(conn, depth.WORKER_LEASES, depth.WorkerLeasesParams(namespace="ns", queue="default"))
    assert [(pod, running, draining) for pod, running, draining, _ in rows] == [("pod-a", 2, False)]

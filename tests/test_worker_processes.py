"""Concurrency and failure claims, proven with real worker processes, real signals and a real
Postgres restart (integration tier)."""

from __future__ import annotations

import signal
import time

import psycopg
import pytest

from queueworker.client.producer import enqueue_many
from tests.support import (FAST_LEASES, WorkerProcess, assert_each_succeeded_once, query, scalar, state_counts,
                           wait_until, worker_id_of)

pytestmark = pytest.mark.integration


def _enqueue(dsn: str, task: str, count: int, payload: dict | None = None, **options) -> list[int]:
    with psycopg.connect(dsn) as conn:
        ids = enqueue_many(conn, ({"task": task, "payload": payload or {}, **options} for _ in range(count)))
    return ids


@pytest.fixture
def workers():
    started: list[WorkerProcess] = []

    def start(dsn: str, *args: str) -> WorkerProcess:
        proc = WorkerProcess(dsn, *args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def test_four_workers_drain_5000_tasks_each_exactly_once(dsn, workers):
    ids = _enqueue(dsn, "qw.noop", 5000)
    procs = [workers(dsn, "--concurrency", "20") for _ in range(4)]
    wait_until(lambda: state_counts(dsn).get("succeeded") == 5000, timeout=120, message="5000 succeeded")
    assert_each_succeeded_once(dsn, ids)
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'running'") == 0
    claimers = scalar(dsn, """SELECT count(DISTINCT worker) FROM queueworker.task_events
                              WHERE to_state = 'running'""")
    assert claimers >= 2, "the work was not shared between worker processes"
    for proc in procs:
        proc.signal(signal.SIGTERM)
    assert all(proc.wait(30) == 0 for proc in procs)
    assert scalar(dsn, "SELECT count(*) FROM queueworker.workers") == 0


def test_sigkilled_worker_leases_are_recovered_and_finished_by_others(dsn, workers):
    ids = _enqueue(dsn, "qw.sleep", 4, {"seconds": 1.5})
    victim = workers(dsn, "--concurrency", "4", *FAST_LEASES)
    victim_id = wait_until(lambda: worker_id_of(dsn, victim.pid), message="victim registered")
    wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE lease_owner = %s",
                              (victim_id,)) == 4, message="victim holds all 4 leases")
    victim.signal(signal.SIGKILL)
    victim.wait()
    killed_at = time.monotonic()
    others = [workers(dsn, "--concurrency", "2", *FAST_LEASES) for _ in range(2)]
    wait_until(lambda: state_counts(dsn).get("succeeded") == 4, timeout=60, message="all 4 succeeded")
    recovered_after = time.monotonic() - killed_at
    assert_each_succeeded_once(dsn, ids)
    rows = query(dsn, "SELECT rescues, attempts, error->>'type' FROM queueworker.tasks WHERE id = ANY(%s)", (ids,))
    assert all(r[0] == 1 and r[1] == 2 for r in rows), rows
    finishers = {r[0] for r in query(dsn, """SELECT worker::text FROM queueworker.task_events
                                             WHERE to_state = 'succeeded' AND task_id = ANY(%s)""", (ids,))}
    assert victim_id not in finishers
    assert finishers <= {worker_id_of(dsn, p.pid) for p in others}
    assert recovered_after < 25, f"recovery took {recovered_after:.1f}s (lease 3 s, rescue every 0.75 s)"


def test_sigstopped_worker_late_completion_is_rejected_by_fencing(dsn, workers):
    (task_id,) = _enqueue(dsn, "qw.sleep", 1, {"seconds": 2})
    sleeper = workers(dsn, "--concurrency", "1", "--lease-seconds", "2", "--heartbeat-seconds", "1")
    wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s",
                              (task_id,)) == "running", message="task claimed")
    sleeper.signal(signal.SIGSTOP)
    rival = workers(dsn, "--concurrency", "1", "--lease-seconds", "2", "--heartbeat-seconds", "1")
    wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s",
                              (task_id,)) == "succeeded", timeout=30, message="rival finished the task")
    finished = query(dsn, "SELECT lease_token, result, finished_at FROM queueworker.tasks WHERE id = %s",
                     (task_id,))[0]
    assert finished[0] == 2, "the rival's claim should carry fencing token 2"
    sleeper.signal(signal.SIGCONT)
    # The sleeper wakes with its attempt long over: it fences itself (its lease ran out by its own
    # clock), or its heartbeat or its completion is refused.
    wait_until(lambda: any(sign in sleeper.log() for sign in ("stale", "lease lost", "lease ran out")), timeout=15,
               message="sleeper noticed it lost the lease")
    sleeper.signal(signal.SIGTERM)
    assert sleeper.wait(30) == 0
    # Nothing the sleeper did, up to its exit, changed the rival's outcome.
    assert query(dsn, "SELECT lease_token, result, finished_at FROM queueworker.tasks WHERE id = %s",
                 (task_id,))[0] == finished
    assert scalar(dsn, """SELECT count(*) FROM queueworker.task_events
                          WHERE task_id = %s AND to_state = 'succeeded'""", (task_id,)) == 1
    assert rival is not None


def test_sigterm_releases_leases_without_consuming_attempts(dsn, workers):
    ids = _enqueue(dsn, "qw.sleep", 3, {"seconds": 4})
    first = workers(dsn, "--concurrency", "3", "--drain-seconds", "0.5")
    first_id = wait_until(lambda: worker_id_of(dsn, first.pid), message="first registered")
    wait_until(lambda: state_counts(dsn).get("running") == 3, message="3 running")
    signalled = time.monotonic()
    first.signal(signal.SIGTERM)
    assert first.wait(20) == 0
    assert time.monotonic() - signalled < 0.5 + 10, "drain took far longer than --drain-seconds"
    rows = query(dsn, "SELECT state::text, attempts FROM queueworker.tasks WHERE id = ANY(%s)", (ids,))
    assert rows == [("pending", 0)] * 3
    assert worker_id_of(dsn, first.pid) is None, "the worker row should be removed on exit"
    workers(dsn, "--concurrency", "3")
    wait_until(lambda: state_counts(dsn).get("succeeded") == 3, timeout=30, message="finished elsewhere")
    assert_each_succeeded_once(dsn, ids)
    assert all(r[0] == 1 for r in query(dsn, "SELECT attempts FROM queueworker.tasks WHERE id = ANY(%s)", (ids,)))
    released = query(dsn, """SELECT count(*) FROM queueworker.task_events
                             WHERE from_state = 'running' AND to_state = 'pending' AND worker = %s""", (first_id,))
    assert released[0][0] == 3


def test_second_signal_cuts_the_drain_short(dsn, workers):
    _enqueue(dsn, "qw.sleep", 2, {"seconds": 60})
    proc = workers(dsn, "--concurrency", "2", "--drain-seconds", "60")
    wait_until(lambda: state_counts(dsn).get("running") == 2, message="2 running")
    proc.signal(signal.SIGTERM)
    wait_until(lambda: "stop requested: draining" in proc.log(), timeout=10, message="the drain to begin")
    proc.signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert state_counts(dsn) == {"pending": 2}


def test_workers_survive_a_postgres_restart(dsn, local_postgres, workers):
    ids = _enqueue(dsn, "qw.sleep", 600, {"seconds": 0.02})
    for _ in range(2):
        workers(dsn, "--concurrency", "10", *FAST_LEASES)
    wait_until(lambda: state_counts(dsn).get("succeeded", 0) >= 50, timeout=60, message="progress before restart")
    local_postgres.restart()
    wait_until(lambda: state_counts(dsn).get("succeeded") == 600, timeout=120, message="all succeeded after restart")
    assert_each_succeeded_once(dsn, ids)


def test_retry_then_success_permanent_failure_exhaustion_and_unknown_task(dsn, workers):
    with psycopg.connect(dsn) as conn:
        retried, = enqueue_many(conn, [{"task": "qw.fail", "payload": {"retryable": True}, "max_attempts": 3}])
        permanent, = enqueue_many(conn, [{"task": "qw.fail", "payload": {"retryable": False, "message": "bad"}}])
        young_unknown, old_unknown, delayed_unknown = enqueue_many(conn, [{"task": "no.such.task"}] * 3)
        # Met unknown by a worker longer ago than the unknown-task grace period (10 minutes by default):
        # no newer worker is coming.
        conn.execute("""UPDATE queueworker.tasks SET error = jsonb_build_object('type', 'UnknownTaskError',
                            'unknown_since', to_char(now() AT TIME ZONE 'UTC' - interval '1 hour',
                                                     'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')) WHERE id = %s""",
                     (old_unknown,))
        # Created an hour ago (delayed, say) but never met unknown: its grace starts at its first claim.
        conn.execute("UPDATE queueworker.tasks SET created_at = now() - interval '1 hour' WHERE id = %s",
                     (delayed_unknown,))
    proc = workers(dsn, "--concurrency", "4", "--retry-base-seconds", "0.5")
    wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (retried,))
               == "retrying", message="retrying after first failure")
    run_after_future = scalar(dsn, "SELECT run_after > now() FROM queueworker.tasks WHERE id = %s", (retried,))
    assert run_after_future
    wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (retried,))
               == "failed", timeout=30, message="exhausted after 3 attempts")
    attempts, error = query(dsn, "SELECT attempts, error FROM queueworker.tasks WHERE id = %s", (retried,))[0]
    assert attempts == 3 and error["type"] == "RuntimeError" and "traceback" in error
    path = [r[0] for r in query(dsn, """SELECT coalesce(from_state::text, '') || '>' || to_state::text
                                        FROM queueworker.task_events WHERE task_id = %s ORDER BY id""", (retried,))]
    assert path == [">pending", "pending>running", "running>retrying", "retrying>pending", "pending>running",
                    "running>retrying", "retrying>pending", "pending>running", "running>failed"]

    assert query(dsn, "SELECT state::text, attempts, error->>'message', error->>'retryable' "
                      "FROM queueworker.tasks WHERE id = %s", (permanent,))[0] == ("failed", 1, "bad", "false")
    state, attempts, message = query(dsn, "SELECT state::text, attempts, error->>'message' FROM queueworker.tasks "
                                          "WHERE id = %s", (old_unknown,))[0]
    assert state == "failed" and attempts == 1 and "no handler registered for task 'no.such.task'" in message
    # A young task of an unknown name goes back, attempt not consumed, due again in a while: a newer
    # worker (rolling deploy) may know it.
    state, attempts, delayed, due_in, message = query(dsn, """
        SELECT state::text, attempts, delayed, extract(epoch FROM run_after - now()), error->>'message'
        FROM queueworker.tasks WHERE id = %s""", (young_unknown,))[0]
    assert (state, attempts, delayed) == ("pending", 0, True) and 0 < due_in <= 10
    assert "no handler registered for task 'no.such.task'" in message
    for task_id in (young_unknown, delayed_unknown):
        wait_until(lambda: [r[0] for r in query(dsn, """
            SELECT coalesce(from_state::text, '') || '>' || to_state::text
            FROM queueworker.task_events WHERE task_id = %s ORDER BY id""", (task_id,))] == [
            ">pending", "pending>running", "running>pending"], message="handed back once, not failed")
    first_met = query(dsn, "SELECT error->>'unknown_since' FROM queueworker.tasks WHERE id = ANY(%s)",
                      ([young_unknown, delayed_unknown],))
    assert all(since and since.endswith("Z") for since, in first_met), "the first meeting is kept for the next"

    # The worker kept running through all of that.
    (after,) = _enqueue(dsn, "qw.noop", 1)
    wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (after,))
               == "succeeded", message="worker still alive")
    assert proc.proc.poll() is None


def test_user_handler_module_sync_and_async(dsn, workers):
    with psycopg.connect(dsn) as conn:
        added, shouted, bad, weird = enqueue_many(conn, [
            {"task": "add", "payload": {"a": 2, "b": 3}}, {"task": "example.shout", "payload": {"text": "hi"}},
            {"task": "add", "payload": {}}, {"task": "unserialisable"}])
    workers(dsn, "--handlers", "tests.example_handlers")
    wait_until(lambda: state_counts(dsn) == {"succeeded": 2, "failed": 2}, message="all four finished")
    results = dict(query(dsn, "SELECT id, coalesce(result, error) FROM queueworker.tasks"))
    assert results[added] == {"sum": 5, "attempt": 1}
    assert results[shouted] == "HI"
    assert results[bad]["type"] == "PermanentError" and results[bad]["message"] == "need a and b"
    assert "not JSON-serialisable" in results[weird]["message"]


def test_hard_deadline_fails_the_attempt_of_a_handler_that_overruns(dsn, workers):
    with psycopg.connect(dsn) as conn:
        (task_id,) = enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": 30}, "timeout_seconds": 1,
                                          "max_attempts": 1}])
    workers(dsn, *FAST_LEASES)
    wait_until(lambda: state_counts(dsn) == {"failed": 1}, timeout=20, message="deadline failure")
    error = scalar(dsn, "SELECT error FROM queueworker.tasks WHERE id = %s", (task_id,))
    assert error["type"] == "DeadlineExceeded" and error["retryable"] is True


def test_metrics_endpoint_counts_claims_and_outcomes(dsn, workers):
    import urllib.request

    from queueworker.dev.localpg import free_port

    port = free_port()
    with psycopg.connect(dsn) as conn:
        enqueue_many(conn, [{"task": "qw.noop"}] * 5 + [{"task": "qw.fail", "payload": {"retryable": False}}])
    workers(dsn, "--metrics-port", str(port))
    wait_until(lambda: state_counts(dsn) == {"succeeded": 5, "failed": 1}, message="all done")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()

    text = wait_until(lambda: (lambda t: t if 'outcome="failed",queue="default"} 1.0' in t else None)(scrape()),
                      message="failure counted")
    assert 'queueworker_tasks_claimed_total{queue="default"} 6.0' in text
    assert 'queueworker_tasks_completed_total{outcome="succeeded",queue="default"} 5.0' in text
    # With nothing left it settles in Idle between its polls (a scrape may catch one of them).
    wait_until(lambda: 'queueworker_worker_state{state="Idle"} 1.0' in scrape(), message="the worker idle")


def test_delayed_task_runs_when_due_not_before(dsn, workers):
    workers(dsn)
    wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.workers") == 1, message="worker up")
    with psycopg.connect(dsn) as conn:
        (task_id,) = enqueue_many(conn, [{"task": "qw.noop", "delay": 1.5}])
    wait_until(lambda: state_counts(dsn) == {"succeeded": 1}, timeout=15, message="delayed task ran")
    # The delay counts from the producer's clock (run_after = its now + 1.5 s), a few ms before the
    # transaction's created_at: so "not before" is judged against run_after itself.
    early, waited = query(dsn, "SELECT extract(epoch FROM run_after - started_at), "
                               "extract(epoch FROM started_at - created_at) FROM queueworker.tasks WHERE id = %s",
                          (task_id,))[0]
    assert float(early) <= 0 and 1.4 < float(waited) < 4.0


def test_default_settings_recover_a_sigkilled_workers_tasks_within_40_seconds(dsn, workers):
    ids = _enqueue(dsn, "qw.sleep", 2, {"seconds": 0.2})
    victim = workers(dsn, "--concurrency", "2")
    victim_id = wait_until(lambda: worker_id_of(dsn, victim.pid), message="victim registered")
    wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE lease_owner = %s",
                              (victim_id,)) == 2, message="victim holds both leases")
    victim.signal(signal.SIGSTOP)  # as dead as SIGKILL for the queue, but we can time from the last heartbeat
    last_heartbeat = scalar(dsn, "SELECT extract(epoch FROM now() - heartbeat_at) FROM queueworker.workers "
                                 "WHERE id = %s", (victim_id,))
    stopped_at = time.monotonic() - float(last_heartbeat)
    victim.signal(signal.SIGKILL)
    workers(dsn, "--concurrency", "2")
    wait_until(lambda: state_counts(dsn).get("succeeded") == 2, timeout=60, message="recovered and finished")
    assert_each_succeeded_once(dsn, ids)
    recovered_after = time.monotonic() - stopped_at
    assert recovered_after <= 40 + 5, f"took {recovered_after:.1f}s after the last heartbeat"

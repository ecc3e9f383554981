"""Unique tasks: the spec hash every task gets, dedupe keys (at most one unfinished task per queue
and key), `dedupe="spec"`, `on_conflict="replace"`, and what `retry` does when the key is taken.
Against a real Postgres; the race is run by several real producer processes."""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import subprocess
import sys
import uuid

import psycopg
import pytest
from pydantic import ValidationError

from queueworker import TaskSpec, cancel, enqueue, enqueue_async, enqueue_many, jsonvalue, retry
from queueworker.client.operations import RetryRefused
from queueworker.db import statements
from queueworker.db.lease import (
    CLAIM, COMPLETE_FAILED, COMPLETE_SUCCEEDED, ClaimParams, CompleteFailedParams, CompleteSucceededParams)
from tests.support import query

pytestmark = pytest.mark.integration


def claim(conn, queue: str = "default") -> dict[int, int]:
    """Leases every claimable task of `queue`: {id: lease token}."""
    rows = statements.fetch(conn, CLAIM, ClaimParams(queue=queue, worker=uuid.uuid4(), lease_seconds=30,
                                                     timeout_seconds=60, limit=100))
    return {row.id: row.lease_token for row in rows}


def succeed(conn, task_id: int, token: int) -> None:
    statements.fetch(conn, COMPLETE_SUCCEEDED, CompleteSucceededParams(ids=[task_id], tokens=[token], results=[None]))


def fail_for_good(conn, task_id: int, token: int) -> None:
    statements.fetch(conn, COMPLETE_FAILED, CompleteFailedParams(ids=[task_id], tokens=[token], retryables=[False],
                                                                 backoffs=[0.0],
                                                                 errors=[jsonvalue.encode({"message": "no"})]))


def test_every_task_gets_the_sha256_of_its_canonical_spec(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = enqueue(conn, "report", {"b": [1, 2], "a": "x"}, queue="q1")
        same = enqueue(conn, "report", {"a": "x", "b": [1, 2]}, queue="q1")  # same spec, other key order
        other = enqueue(conn, "report", {"a": "x", "b": [1, 2]}, queue="q2")
        (digest, in_sql), = conn.execute(
            "SELECT spec_hash, queueworker.spec_hash('q1', 'report', '{\"a\": \"x\", \"b\": [1, 2]}') "
            "FROM queueworker.tasks WHERE id = %s", (first,)).fetchall()
        hashes = dict(conn.execute("SELECT id, spec_hash FROM queueworker.tasks WHERE id = ANY(%s)",
                                   ([first, same, other],)).fetchall())
    # jsonb's canonical text: keys sorted (shorter first), ", " and ": " separators.
    assert bytes(digest) == hashlib.sha256(b'["q1", "report", {"a": "x", "b": [1, 2]}]').digest() == bytes(in_sql)
    assert hashes[first] == hashes[same] != hashes[other]
    assert first != same, "a spec hash alone does not make a task unique"


def test_a_duplicate_key_returns_the_unfinished_task_and_creates_nothing(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = enqueue(conn, "sync", {"account": 1}, dedupe_key="account-1")
        again = enqueue(conn, "sync", {"account": 1, "other": True}, dedupe_key="account-1")
        elsewhere = enqueue(conn, "sync", {"account": 1}, dedupe_key="account-1", queue="other")
        assert again == first != elsewhere
        token = claim(conn)[first]
        assert enqueue(conn, "sync", dedupe_key="account-1") == first, "running still holds the key"
        succeed(conn, token=token, task_id=first)
        after = enqueue(conn, "sync", {"account": 1}, dedupe_key="account-1")
    assert after not in (first, elsewhere), "a finished task frees its key"
    assert query(dsn, "SELECT count(*) FROM queueworker.tasks WHERE dedupe_key = 'account-1'")[0][0] == 3
    assert query(dsn, "SELECT payload FROM queueworker.tasks WHERE id = %s", (first,))[0][0] == {"account": 1}
    events = query(dsn, "SELECT task_id, from_state::text, to_state::text FROM queueworker.task_events "
                        "WHERE task_id = ANY(%s) ORDER BY id", ([first, after],))
    assert events == [(first, None, "pending"), (first, "pending", "running"), (first, "running", "succeeded"),
                      (after, None, "pending")], "a duplicate leaves no trace in the audit trail"


def test_dedupe_by_spec_uses_the_spec_hash_as_the_key(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = enqueue(conn, "render", {"page": 1, "size": "a4"}, dedupe="spec")
        assert enqueue(conn, "render", {"size": "a4", "page": 1}, dedupe="spec") == first
        assert enqueue(conn, "render", {"page": 2, "size": "a4"}, dedupe="spec") != first
        assert enqueue(conn, "render", {"page": 1, "size": "a4"}) != first, "only specs that ask are deduplicated"
        key, spec_hash = conn.execute("SELECT dedupe_key, spec_hash FROM queueworker.tasks WHERE id = %s",
                                      (first,)).fetchone()
    assert key == bytes(spec_hash).hex()


def test_replace_updates_a_pending_duplicate_and_audits_it(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        task_id = enqueue(conn, "digest", {"v": 1}, dedupe_key="digest", delay=3600)
        replaced = enqueue(conn, "digest", {"v": 2}, dedupe_key="digest", priority=5, on_conflict="replace")
        unchanged = enqueue(conn, "digest", {"v": 2}, dedupe_key="digest", priority=5, on_conflict="replace")
        ignored = enqueue(conn, "digest", {"v": 3}, dedupe_key="digest")
        assert replaced == unchanged == ignored == task_id
        row = conn.execute("SELECT payload, priority, delayed, run_after <= now() FROM queueworker.tasks "
                           "WHERE id = %s", (task_id,)).fetchone()
        assert row == ({"v": 2}, 5, False, True), "replaced: the new payload and priority, due now"
        assert conn.execute("SELECT spec_hash = queueworker.spec_hash(queue, task, payload) FROM queueworker.tasks "
                            "WHERE id = %s", (task_id,)).fetchone()[0], "the spec hash follows the payload"
        token = claim(conn)[task_id]
        assert enqueue(conn, "digest", {"v": 4}, dedupe_key="digest", on_conflict="replace") == task_id
        assert conn.execute("SELECT payload FROM queueworker.tasks WHERE id = %s", (task_id,)).fetchone()[0] == {
            "v": 2}, "a running duplicate is not replaced"
        succeed(conn, task_id, token)
    events = query(dsn, "SELECT from_state::text, to_state::text, detail FROM queueworker.task_events "
                        "WHERE task_id = %s ORDER BY id", (task_id,))
    assert events[:2] == [(None, "pending", None), ("pending", "pending", {"replaced": ["payload", "priority",
                                                                                         "run_after"]})]
    assert [e[:2] for e in events[2:]] == [("pending", "running"), ("running", "succeeded")], \
        "an unchanged replace writes nothing"


def test_duplicates_within_one_batch(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = enqueue_many(conn, [
            TaskSpec(task="t", payload={"n": 1}, dedupe_key="k"),
            TaskSpec(task="t", payload={"n": 2}),
            TaskSpec(task="t", payload={"n": 3}, dedupe_key="k", on_conflict="replace"),
            TaskSpec(task="t", payload={"n": 4}, dedupe_key="k"),
            TaskSpec(task="t", payload={"n": 5}, dedupe_key="j"),
        ])
    assert ids[0] == ids[2] == ids[3] and len({ids[0], ids[1], ids[4]}) == 3
    assert query(dsn, "SELECT payload FROM queueworker.tasks WHERE id = %s", (ids[0],))[0][0] == {"n": 3}
    assert query(dsn, "SELECT count(*) FROM queueworker.tasks")[0][0] == 3


def test_the_async_producer_deduplicates_too(dsn):
    async def main() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return (await enqueue_async(conn, "a", dedupe_key="once"),
                    await enqueue_async(conn, "a", {"x": 1}, dedupe_key="once"))
    first, second = asyncio.run(main())
    assert first == second


@pytest.mark.parametrize("options, message", [
    ({"dedupe_key": "k", "dedupe": "spec"}, 'dedupe_key or dedupe="spec"'),
    ({"on_conflict": "replace"}, "needs a dedupe_key"),
    ({"dedupe_key": ""}, "at least 1 character"),
    ({"dedupe_key": "a\x00b"}, "printable"),
    ({"dedupe_key": "k" * 513}, "at most 512"),
    ({"dedupe": "payload"}, "'spec'"),
    ({"dedupe_key": "k", "on_conflict": "merge"}, "'ignore' or 'replace'"),
])
def test_bad_unique_options_are_refused_before_the_database(options, message):
    with pytest.raises(ValidationError, match=message):
        TaskSpec(task="t", **options)


def _race(dsn: str, barrier, results) -> None:
    with psycopg.connect(dsn) as conn:
        barrier.wait()
        results.put(enqueue(conn, "race", {"pid": multiprocessing.current_process().pid}, dedupe_key="the-key"))
        conn.execute("SELECT pg_sleep(0.2)")  # hold the transaction open while the others insert


def test_eight_producer_processes_racing_for_one_key_make_one_task(dsn):
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(8), context.Queue()
    producers = [context.Process(target=_race, args=(dsn, barrier, results)) for _ in range(8)]
    for process in producers:
        process.start()
    for process in producers:
        process.join(60)
        assert process.exitcode == 0
    ids = {results.get(timeout=5) for _ in producers}
    assert len(ids) == 1
    assert query(dsn, "SELECT count(*) FROM queueworker.tasks WHERE dedupe_key = 'the-key'")[0][0] == 1
    assert query(dsn, "SELECT count(*) FROM queueworker.task_events")[0][0] == 1


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queueworker.cli", *args, "--dsn", dsn],
                          capture_output=True, text=True, timeout=60)


def test_cli_enqueue_with_a_dedupe_key_and_a_retry_blocked_by_the_key(dsn):
    first = cli(dsn, "enqueue", "-q", "job", "--dedupe-key", "nightly", "--payload", '{"day": 1}')
    again = cli(dsn, "enqueue", "job", "--dedupe-key", "nightly", "--payload", '{"day": 2}',
                "--on-conflict", "replace")
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    task_id = int(first.stdout)
    assert again.stdout == f"task {task_id} (job) on queue default\n" and "already held" in again.stderr
    assert query(dsn, "SELECT payload FROM queueworker.tasks WHERE id = %s", (task_id,))[0][0] == {"day": 2}
    by_spec = cli(dsn, "enqueue", "-q", "job", "--dedupe-spec", "--payload", '{"day": 3}')
    assert by_spec.returncode == 0 and int(by_spec.stdout) != task_id
    both = cli(dsn, "enqueue", "job", "--dedupe-spec", "--dedupe-key", "x")
    assert both.returncode == 2 and "not allowed with" in both.stderr

    with psycopg.connect(dsn, autocommit=True) as conn:
        fail_for_good(conn, task_id, claim(conn)[task_id])
        holder = enqueue(conn, "job", dedupe_key="nightly")
    refused = cli(dsn, "retry", str(task_id))
    assert refused.returncode == 2
    assert f"task {task_id} cannot be retried" in refused.stderr and f"unfinished task {holder}" in refused.stderr
    assert query(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task_id,))[0][0] == "failed"

    with psycopg.connect(dsn, autocommit=True) as conn:
        cancel(conn, holder)
    retried = cli(dsn, "retry", str(task_id))
    assert retried.returncode == 0, retried.stderr
    assert query(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task_id,))[0][0] == "pending"


def test_retry_from_an_application_connection(dsn):
    """`queueworker.retry` on the caller's connection: inside its transaction, refusing what the
    CLI refuses with the reason, changing nothing when refused."""
    with psycopg.connect(dsn) as conn:
        done = enqueue(conn, "job", {"n": 1}, dedupe_key="k")
        cancel(conn, done)
        holder = enqueue(conn, "job", {"n": 2}, dedupe_key="k")  # the key is free again: taken
        conn.commit()
        with pytest.raises(RetryRefused, match=f"held by unfinished task {holder}"):
            retry(conn, done)
        with pytest.raises(RetryRefused, match=f"task {holder} is pending; only failed or cancelled"):
            retry(conn, holder)
        with pytest.raises(RetryRefused, match="no task with id 424242"):
            retry(conn, 424242)
        with pytest.raises(ValueError, match="not a task id"):
            retry(conn, True)
        with conn.transaction():  # the caller's transaction decides
            cancel(conn, holder)
            row = retry(conn, done)
            assert (row.id, row.queue) == (done, "default")
            raise psycopg.Rollback
        assert query(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (done,)) == [("cancelled",)]
        with conn.transaction():
            cancel(conn, holder)
            retry(conn, done)
    assert query(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (done,)) == [("pending",)]

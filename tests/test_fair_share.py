"""Fair share across the keys of a queue (docs/flow-control.md, migration 020): real worker processes
claim a queue where one key's big backlog came first, and each key that came after starts within
about one round; weights give a key that many claims per turn; every path that makes a task
claimable tags it; a queue without keys keeps the plain claim; the claim's cost does not grow with
the number of keys; and a producer login can neither forge a tag nor touch a key's weight."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import psycopg
import pytest

from queueworker import enqueue_many
from queueworker.client import operations
from queueworker.client.producer import COPY_THRESHOLD, TaskSpec
from queueworker.db import statements
from queueworker.db.duties import PROMOTE_DUE, RESCUE, PromoteDueParams, RescueParams
from queueworker.db.lease import (
    CLAIM, CLAIM_FAIR, CLAIM_LIMITED_FAIR, COMPLETE_CONTINUED, LOCK_QUEUE, RELEASE, ClaimParams, CompleteContinuedParams,
    DeregisterWorkerParams, LockQueueParams)
from tests.support import WorkerProcess, query, scalar, wait_until
from tests.test_queue_grants import DENIED, tenants
from tests.test_roles import installation  # noqa: F401 (a fixture: a login per role of docs/database-roles.sql)

pytestmark = pytest.mark.integration


def claim(conn: psycopg.Connection, queue: str, limit: int = 1, statement=CLAIM_FAIR) -> list[int]:
    return [row.id for row in statements.fetch(conn, statement, ClaimParams(
        queue=queue, limit=limit, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60))]


def keys_of(dsn: str, ids: list[int]) -> list[str | None]:
    key = dict(query(dsn, "SELECT id, key FROM queueworker.tasks WHERE id = ANY(%s)", (ids,)))
    return [key[task_id] for task_id in ids]


def untagged(dsn: str, queue: str) -> int:
    """Claimable tasks of the queue without a tag: none may be, in a keyed queue."""
    return scalar(dsn, "SELECT count(*) FROM queueworker.tasks_active WHERE queue = %s AND state = 'pending' "
                       "AND NOT delayed AND fair_tag IS NULL", (queue,))


def test_a_big_backlog_delays_the_keys_after_it_by_about_one_round_with_real_workers(dsn):
    """One key enqueues 2,000 tasks, then five keys three each. Two worker processes of four slots
    drain the queue; from the audit trail, each small key's first task starts within the first
    round (six keys, plus the slots claiming at once), where FIFO would start it after the 2,000."""
    big, small = 2000, [f"tenant-{n}" for n in range(5)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [TaskSpec(task="qw.noop", queue="shared", key="whale")] * big)
        for key in small:
            enqueue_many(conn, [TaskSpec(task="qw.noop", queue="shared", key=key)] * 3)
    total = big + 3 * len(small)
    workers = [WorkerProcess(dsn, "--queue", "shared", "--concurrency", "4") for _ in range(2)]
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == total,
                   timeout=120, message=f"all {total} tasks to succeed")
    finally:
        for worker in workers:
            worker.stop()
    started = [key for key, in query(dsn, """
        SELECT t.key FROM queueworker.task_events e JOIN queueworker.tasks t ON t.id = e.task_id
        WHERE e.to_state = 'running' ORDER BY e.id""")]
    assert len(started) == total
    first = {key: started.index(key) for key in small}
    last = {key: len(started) - 1 - started[::-1].index(key) for key in small}
    print(f"position of each small key's first start: {first}, of its last: {last}")
    one_round, in_flight = 1 + len(small), 2 * 4
    assert max(first.values()) < one_round + in_flight, first
    assert max(last.values()) < 3 * one_round + in_flight, last


def test_a_running_worker_hears_at_once_that_its_queue_became_keyed(dsn):
    """The worker claims the queue with the plain claim, which steps aside once the queue is keyed:
    the first keyed task tells it (channel queueworker_queues) to switch to the fair claim, well
    before its 5-minute safety re-read."""
    worker = WorkerProcess(dsn, "--queue", "late")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [TaskSpec(task="qw.noop", queue="late")] * 5)
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 5,
                   timeout=30, message="the plain tasks to succeed")
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [TaskSpec(task="qw.noop", queue="late", key=f"k{n % 3}") for n in range(30)])
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 35,
                   timeout=60, message="the keyed tasks to succeed")
    finally:
        worker.stop()
    assert "fair share on late" in worker.log()


def test_weights_give_a_key_that_many_claims_per_turn(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "weighted", key="gold", weight=3)
        operations.set_limits(conn, "weighted", key="bronze", weight=0.5)
        for key in ("gold", "silver", "bronze"):
            enqueue_many(conn, [TaskSpec(task="t", queue="weighted", key=key)] * 300)
        taken = [task_id for _ in range(45) for task_id in claim(conn, "weighted", 4)]
    counts = Counter(keys_of(dsn, taken))
    # Per turn: gold 3, silver 1, bronze 0.5, of 4.5: of 180 claims, 120, 40 and 20.
    assert 110 <= counts["gold"] <= 130 and 32 <= counts["silver"] <= 48 and 14 <= counts["bronze"] <= 26, counts
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert operations.set_limits(conn, "weighted", key="gold").weight == 3, "the weight it had"
        assert operations.set_limits(conn, "weighted", key="gold") is None, "none left to clear"
    changes = query(dsn, "SELECT change, detail FROM queueworker.queue_events WHERE queue = 'weighted' ORDER BY id")
    assert [change for change, _ in changes] == ["key_weight", "key_weight", "keyed", "key_cleared"]
    assert changes[0][1] == {"key": "gold", "weight": 3}


@pytest.mark.parametrize("weight", [0, -1, float("nan"), float("inf"), 1e9, 0.0001, True, "2"])
def test_a_bad_weight_is_refused_and_changes_nothing(dsn, weight):
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(ValueError, match="weight"):
            operations.set_limits(conn, "q", key="k", weight=weight)
    assert scalar(dsn, "SELECT count(*) FROM queueworker.queue_keys") == 0


@pytest.mark.parametrize("key", ["", "x" * 257, "a\nb", "a\x1bb", "a\u2028b"])
def test_a_bad_key_is_refused_in_one_line_without_echoing_it(dsn, key):
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(ValueError) as refused:
            operations.set_limits(conn, "q", key=key, weight=2)
    assert "\n" not in str(refused.value) and (not key or key not in str(refused.value))
    assert scalar(dsn, "SELECT count(*) FROM queueworker.queue_keys") == 0


def test_priority_first_and_tasks_without_a_key_are_one_key(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [TaskSpec(task="t", queue="mixed")] * 50)  # before the queue is keyed
        enqueue_many(conn, [TaskSpec(task="t", queue="mixed", key="a")] * 50)
        enqueue_many(conn, [TaskSpec(task="t", queue="mixed", key="b")] * 50)
        urgent = enqueue_many(conn, [TaskSpec(task="t", queue="mixed", key="a", priority=5)] * 3)
        taken = [task_id for _ in range(33) for task_id in claim(conn, "mixed")]
        late = enqueue_many(conn, [TaskSpec(task="t", queue="mixed", key="c")])
        # Ties go to the older task, so a newcomer's tag is one round ahead and its turn comes at the end of it.
        assert late[0] in claim(conn, "mixed", 2 * 3 + 1), "a new key's first task: within about one round"
    assert taken[:3] == urgent, "a higher priority goes first, whatever its key's turn"
    with psycopg.connect(dsn, autocommit=True) as conn:
        raised, = enqueue_many(conn, [TaskSpec(task="t", queue="mixed", key="a", dedupe_key="moved")])
        enqueue_many(conn, [TaskSpec(task="t", queue="mixed", key="b", priority=5)] * 3)
        enqueue_many(conn, [TaskSpec(task="t", queue="mixed", key="a", dedupe_key="moved", priority=5,
                                     on_conflict="replace")])
        # Its tag is counted again at its new priority (b's three are at 1, 2, 3 there): not its old one.
        assert raised in claim(conn, "mixed", 3), "a priority replaced: its key's turn in its new line"
    counts = Counter(keys_of(dsn, taken[3:]))
    assert all(9 <= counts[key] <= 11 for key in (None, "a", "b")), counts


def test_every_path_that_makes_a_task_claimable_tags_it(dsn):
    """Enqueue (arrays, COPY, enqueue_tasks), promote_due (a delayed task and a retry), rescue,
    a continued task's next page, release, and settlement of a dependent: afterwards no claimable
    task of the keyed queue lacks a tag, and a task back in line goes behind its key's waiting
    tasks, not behind everyone."""
    queue, me = "paths", uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [TaskSpec(task="t", queue=queue, key="a")] * 20)
        enqueue_many(conn, [TaskSpec(task="t", queue=queue, key="b")] * (COPY_THRESHOLD + 1))  # the COPY path
        first, = enqueue_many(conn, [TaskSpec(task="t", queue=queue, key="c", dedupe_key="once")])  # enqueue_tasks
        enqueue_many(conn, [TaskSpec(task="t", queue=queue, key="d", depends_on=[first])])  # blocked
        enqueue_many(conn, [TaskSpec(task="t", queue=queue, key="e", delay=1.0)])  # delayed
        assert untagged(dsn, queue) == 0
        claimed = statements.fetch(conn, CLAIM_FAIR, ClaimParams(queue=queue, limit=6, worker=me, lease_seconds=30,
                                                                 timeout_seconds=60))
        assert first in [row.id for row in claimed], "c's only task is in the first round"
        of_a = sorted((row for row in claimed if keys_of(dsn, [row.id]) == ["a"]), key=lambda row: row.id)
        retried, rescued, continued = of_a[:3]
        conn.execute("UPDATE queueworker.tasks SET state = 'retrying', run_after = now(), lease_owner = NULL, "
                     "leased_until = NULL, deadline_at = NULL WHERE id = %s", (retried.id,))
        conn.execute("UPDATE queueworker.tasks SET leased_until = now() - interval '1 second' WHERE id = %s",
                     (rescued.id,))
        statements.fetch(conn, COMPLETE_CONTINUED, CompleteContinuedParams(
            ids=[continued.id], tokens=[continued.lease_token], results=[None], next_payloads=["{}"],
            next_delays=[0.0], next_headers=[None]))
        wait_until(lambda: scalar(dsn, "SELECT now() > max(run_after) FROM queueworker.tasks WHERE key = 'e'"),
                   timeout=5, message="the delayed task to come due")
        statements.fetch(conn, PROMOTE_DUE, PromoteDueParams(limit=100))
        statements.fetch(conn, RESCUE, RescueParams(limit=100, deadline_grace=60, worker_ttl=3600))
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now(), lease_owner = NULL, "
                     "leased_until = NULL, deadline_at = NULL WHERE id = %s", (first,))
        released = statements.fetch(conn, RELEASE, DeregisterWorkerParams(worker=me))
        assert sorted(keys_of(dsn, [row.id for row in released])) == ["b", "b"]
        assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE queue = %s AND key IN ('d', 'e') "
                           "AND state = 'pending' AND NOT delayed", (queue,)) == 2
        assert untagged(dsn, queue) == 0
        back = scalar(dsn, "SELECT fair_tag FROM queueworker.tasks WHERE id = %s", (retried.id,))
        line = scalar(dsn, "SELECT max(fair_tag) FROM queueworker.tasks_active WHERE key = 'a' AND id <> ALL(%s)",
                      ([retried.id, rescued.id],))
        last = scalar(dsn, "SELECT max(fair_tag) FROM queueworker.tasks_active")
        assert line < back < last, "a retried task goes behind its key's waiting tasks, ahead of a longer line"
        drained = claim(conn, queue, 10_000)
    # a: 20, all back or continued; b: all, two released; c: done; d: settled; e: promoted.
    assert untagged(dsn, queue) == 0 and len(drained) == 20 + COPY_THRESHOLD + 1 + 2


def test_a_task_left_without_a_tag_is_still_claimed_after_the_tagged_ones(dsn):
    """The fair claim's safety net: a claimable task of a keyed queue without a tag (made claimable
    by a transaction that had not seen the queue become keyed; here its tag is taken by hand)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        first, *others = enqueue_many(conn, [TaskSpec(task="t", queue="net", key="k")] * 4)
        conn.execute("UPDATE queueworker.tasks_active SET fair_tag = NULL WHERE id = %s", (first,))
        assert sorted(claim(conn, "net", 3)) == others, "the tagged ones first"
        assert claim(conn, "net", 10) == [first]


def test_a_queue_without_keys_keeps_the_plain_claim(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = enqueue_many(conn, [TaskSpec(task="t", queue="plain")] * 10)
        enqueue_many(conn, [TaskSpec(task="t", queue="keyed", key="k")] * 10)
        assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE queue = 'plain' "
                           "AND fair_tag IS NOT NULL") == 0, "untagged: in neither fair-share index"
        assert scalar(dsn, "SELECT count(*) FROM queueworker.queues WHERE name = 'plain'") == 0
        assert claim(conn, "plain", 10, CLAIM) == ids, "FIFO, by the plain claim"
        assert claim(conn, "keyed", 10, CLAIM) == [], "the plain claim steps aside for a keyed queue"
        assert len(claim(conn, "keyed", 10, CLAIM_FAIR)) == 10


def test_a_keyed_queue_with_flow_control_keeps_its_limits_and_the_fair_order(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [TaskSpec(task="t", queue="both", key="big")] * 100)
        enqueue_many(conn, [TaskSpec(task="t", queue="both", key="small")] * 2)
        operations.set_limits(conn, "both", max_running=3)
        assert claim(conn, "both", 10, CLAIM_FAIR) == [], "the fair claim steps aside for a limited queue"
        with conn.transaction():
            statements.execute(conn, LOCK_QUEUE, LockQueueParams(queue="both"))
            taken = claim(conn, "both", 10, CLAIM_LIMITED_FAIR)
    assert len(taken) == 3 and "small" in keys_of(dsn, taken)


def claim_buffers(conn: psycopg.Connection, queue: str) -> int:
    """Shared buffers (hit + read) the fair claim of 10 tasks touches, from EXPLAIN (ANALYZE,
    BUFFERS), in a transaction rolled back so that each measure claims from the same rows."""
    with conn.transaction(force_rollback=True):
        plan, = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM_FAIR.text, ClaimParams(
            queue=queue, limit=10, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60).__dict__
                            ).fetchone()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    top = plan[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def test_the_claim_costs_the_same_at_a_thousand_keys_and_at_a_hundred_thousand(dsn):
    """The same 100,000 tasks, in 1,000 keys of 100 or in 100,000 keys of 1: the fair claim reads
    about the same buffers (one index scan), where a claim that looked at each key would read
    hundreds of times more."""
    count, measured = 100_000, {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for keys in (1_000, 100_000):
            queue = f"keys-{keys}"
            # Written by one INSERT through queueworker.tasks: the tagging triggers tag them as they
            # tag an enqueue's (what is measured here is the claim, not the producer).
            conn.execute("INSERT INTO queueworker.tasks (queue, task, key) "
                         "SELECT %s, 't', 'k' || (n %% %s) FROM generate_series(0, %s - 1) AS n",
                         (queue, keys, count))
            conn.execute("VACUUM ANALYZE queueworker.tasks_active")
            claim_buffers(conn, queue)  # warm
            measured[keys] = min(claim_buffers(conn, queue) for _ in range(3))
    print(f"buffers of the fair claim of 10 tasks: {measured}")
    assert measured[100_000] <= 2 * measured[1_000] + 50, measured


def test_a_producer_can_neither_forge_a_tag_nor_touch_a_key_weight(installation):
    installation.install()
    with tenants(installation, "alpha") as logins, psycopg.connect(logins["alpha"], autocommit=True) as conn:
        enqueue_many(conn, [TaskSpec(task="qw.noop", queue="alpha.jobs", key="mine")] * 3)
        for forge in ("INSERT INTO queueworker.tasks (queue, task, key, fair_tag) VALUES ('alpha.jobs', 't', 'x', -1e9)",
                      "UPDATE queueworker.tasks SET fair_tag = -1e9",
                      "INSERT INTO queueworker.queue_keys (queue, key, weight) VALUES ('beta.jobs', 'theirs', 1000)",
                      "UPDATE queueworker.queue_keys SET weight = 1000",
                      "DELETE FROM queueworker.queue_keys",
                      "UPDATE queueworker.queues SET keyed = false",
                      "SELECT queueworker.tag_fair(ARRAY[1::bigint], ARRAY[]::bigint[])"):
            with pytest.raises(DENIED):
                conn.execute(forge)
        with pytest.raises(DENIED):
            operations.set_limits(conn, "alpha.jobs", key="mine", weight=1000)
    tags = [tag for tag, in query(installation.admin, "SELECT fair_tag FROM queueworker.tasks ORDER BY id")]
    assert tags == [1.0, 2.0, 3.0], "tagged by the trigger, as the owner"

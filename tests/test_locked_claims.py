"""Claims under a queue's row lock (docs/flow-control.md, "How it is enforced"): the lock serialises
every claim of a limited queue, so what runs under it is kept to the server's own work."""

from __future__ import annotations

import asyncio
import uuid
from typing import NamedTuple

import psycopg
import pytest
from psycopg import sql

from queueworker import enqueue_many
from queueworker.client import operations
from queueworker.db import statements
from queueworker.db.connection import DutyConnection, connect
from queueworker.db.lease import (ASYNC_COMMIT_CLAIMS, CLAIM, CLAIM_KEYS, LOCK_KEYS, LOCK_QUEUE, ClaimParams,
                                  KeyClaimParams, LockQueueParams)
from queueworker.db.statements import NO_PARAMS, Bound, NoParams, Statement
from tests.support import query, scalar, until, wait_until

pytestmark = pytest.mark.integration

LOCK = Bound(LOCK_KEYS, LockQueueParams(queue="q"))


def key_limited_queue(dsn: str, tasks: int) -> KeyClaimParams:
    """A key-limited queue "q" with `tasks` tasks over 5 keys, and the parameters of a claim of 10."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "q", per_key_rate_per_second=1000, per_key_burst=1000, per_key_max_running=100)
        enqueue_many(conn, [{"task": "t", "queue": "q", "key": f"k{n % 5}"} for n in range(tasks)])
    return KeyClaimParams(queue="q", limit=10, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60,
                          held_keys=[])


class TransactionRow(NamedTuple):
    transaction: int


# Logs the transaction it runs in (a test's own statement, sent as the lock and the claim are).
LOGGED = Statement("test.logged", "INSERT INTO lock_log VALUES (txid_current()) RETURNING transaction",
                   NoParams, TransactionRow)


def test_the_lock_and_what_it_guards_run_in_one_transaction(dsn):
    """Sent together, the two statements are one transaction, so the lock is held until the
    claim's commit (a Sync between them would commit the lock, and release it, first)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE lock_log (transaction bigint)")

    async def both_logged() -> list[TransactionRow]:
        conn = await connect(dsn, "test-claimer")
        try:
            return await statements.fetch_after_lock_async(conn, Bound(LOGGED, NO_PARAMS), LOGGED, NO_PARAMS)
        finally:
            await conn.close()

    [claim] = asyncio.run(both_logged())
    assert query(dsn, "SELECT transaction FROM lock_log") == [(claim.transaction,)] * 2


class SettingRow(NamedTuple):
    synchronous_commit: str


SYNCHRONOUS_COMMIT = Statement("test.synchronous_commit", "SELECT current_setting('synchronous_commit') "
                               "AS synchronous_commit", NoParams, SettingRow)


@pytest.mark.parametrize("lock", [LOCK_QUEUE, LOCK_KEYS])
def test_a_claim_under_the_lock_commits_durably_where_a_plain_claim_does_not(dsn, lock):
    """A worker's plain and fair claims commit without waiting for the disk (--async-claim-commit),
    but a claim under a queue's lock commits durably: its limits count what it wrote, and a claim a
    crash lost would have started tasks nobody counts. Either setting is the transaction's own: the
    duty connection's next statement (a heartbeat, say) is durable; and a plain or fair claim with
    --no-async-claim-commit waits for the disk too."""
    key_limited_queue(dsn, 1)
    with psycopg.connect(dsn, autocommit=True) as conn:  # the test server's own default is off
        conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(sql.Identifier(conn.info.dbname)))

    plain = ClaimParams(queue="plain", limit=1, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60)

    async def settings() -> tuple[str, ...]:
        claimer = DutyConnection(dsn, "test-claimer")  # as a worker's duty connection
        try:
            # Each read in the transaction of what runs first: a plain claim (its function sets the
            # commit for the rest of its transaction), the queue's lock, nothing, a durable plain claim.
            firsts = (Bound(ASYNC_COMMIT_CLAIMS[CLAIM], plain), Bound(lock, LockQueueParams(queue="q")), None,
                      Bound(CLAIM, plain))
            return tuple([(await claimer.fetch(SYNCHRONOUS_COMMIT, NO_PARAMS, first=first))[0].synchronous_commit
                          for first in firsts])
        finally:
            await claimer.close()
    assert asyncio.run(settings()) == ("off", "on", "on", "on")


def test_a_claim_commits_once_granted_the_lock_without_a_word_more_from_its_worker(dsn):
    """The lock and the claim go out together and commit at one Sync: once the queue's row is
    granted, the server claims and commits with nothing more from the worker, so the lock is never
    held across a round trip to it. The test holds the row, lets a claim wait for it, then stops
    the claim's event loop (only blocking calls from there: the claim's client can neither read nor
    send) and lets the row go: the claim's tasks must be running, committed, meanwhile. A claim
    that waited for its worker between the lock and the claim (or the commit) would hold the row
    and commit nothing until the loop ran again."""
    params = key_limited_queue(dsn, 20)

    async def scenario() -> int:
        holder = psycopg.connect(dsn)
        claimer = DutyConnection(dsn, "test-claimer")
        try:
            holder.execute("SELECT FROM queueworker.queues WHERE name = 'q' FOR NO KEY UPDATE")
            claim = asyncio.create_task(claimer.fetch(CLAIM_KEYS, params, first=LOCK))
            await until(lambda: scalar(dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                            " AND application_name = 'test-claimer'"),
                        10, "the claim to wait for the queue's row")
            # From here nothing awaits until the claim has committed: the claimer's loop is stopped.
            holder.commit()
            wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'running'") == 10,
                       timeout=10, message="the claim to commit while its worker's loop is stopped")
            return len(await claim)
        finally:
            holder.close()
            await claimer.close()

    assert asyncio.run(scenario()) == 10


def test_a_key_limited_claim_is_planned_once_per_connection(dsn):
    """The claim of a key-limited queue runs under the queue's lock, and planned for its parameters
    it spent about 2 ms there each time: it is planned once per connection (a generic plan, kept
    with the prepared statement), though the worker's sessions force custom plans for every other
    statement."""
    params = key_limited_queue(dsn, 50)

    async def claims() -> list[tuple[int, int]]:
        conn = await connect(dsn, "test-claimer", prepare=True)
        try:
            for _ in range(4):
                async with conn.transaction():
                    await statements.execute_async(conn, LOCK.statement, LOCK.params, prepare=None)
                    assert len(await statements.fetch_async(conn, CLAIM_KEYS, params, prepare=None)) == 10
            cursor = await conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                                        " WHERE statement LIKE '%%charged_keys AS%%'")  # CLAIM_KEYS, as sent
            return await cursor.fetchall()
        finally:
            await conn.close()

    [(generic, custom)] = asyncio.run(claims())
    assert custom == 0
    assert generic >= 1


def plan_nodes(node: dict) -> list[dict]:
    return [node, *(found for child in node.get("Plans", ()) for found in plan_nodes(child))]


def explained_claim(dsn: str, params: KeyClaimParams) -> list[dict]:
    """The nodes of a claim's plan, run under the lock (EXPLAIN ANALYZE: it claims)."""
    with psycopg.connect(dsn) as conn:
        statements.execute(conn, LOCK.statement, LOCK.params)
        [[plan]] = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + CLAIM_KEYS.text, CLAIM_KEYS.bind(params)).fetchall()
        conn.commit()
    return plan_nodes(plan[0]["Plan"])


def test_a_claim_counts_the_running_tasks_per_key_once_not_once_per_key(dsn):
    """The running tasks per key are read once per claim and joined to the keys met: looked up
    for each key instead, the claim scanned all of them once per key under the lock."""
    params = key_limited_queue(dsn, 100)
    explained_claim(dsn, params)  # tasks of every key running
    scans = [node["Actual Loops"] for node in explained_claim(dsn, params) if node.get("CTE Name") == "running"]
    assert scans and max(scans) == 1


def test_a_claim_with_per_key_defaults_alone_reads_no_key_settings_and_writes_nothing_to_the_queue(dsn):
    """Under the lock, a claim of a queue whose keys have no settings of their own (defaults only)
    probes no key for settings it cannot have, and leaves the queue's row as it was when the queue
    has neither a rate nor a breaker of its own (a key's own cap still binds: tests/test_key_limits.py)."""
    params = key_limited_queue(dsn, 50)
    before = scalar(dsn, "SELECT xmin::text FROM queueworker.queues WHERE name = 'q'")
    key_settings = [node for node in explained_claim(dsn, params) if node.get("Index Name") == "queue_keys_pkey"]
    assert key_settings, "the claim can read keys' own settings"
    assert [node["Actual Loops"] for node in key_settings] == [0] * len(key_settings)
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'running'") == 10
    assert scalar(dsn, "SELECT xmin::text FROM queueworker.queues WHERE name = 'q'") == before


def test_claims_under_the_lock_go_through_pgbouncer_in_transaction_pooling(pgbouncer_dsn, dsn):
    """The lock and the claim end at one Sync, which is where PgBouncer in transaction pooling
    gives the server connection back: each claim is one transaction on one server connection, and
    the claims see each other's tasks (the keys' caps hold across them)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "q", per_key_max_running=2)
        enqueue_many(conn, [{"task": "t", "queue": "q", "key": f"k{n % 5}"} for n in range(50)])
    params = KeyClaimParams(queue="q", limit=4, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60,
                            held_keys=[])

    async def claims() -> list[int]:
        claimer = DutyConnection(pgbouncer_dsn, "test-claimer")
        try:
            return [len(await claimer.fetch(CLAIM_KEYS, params, first=LOCK)) for _ in range(4)]
        finally:
            await claimer.close()

    assert asyncio.run(claims()) == [4, 4, 2, 0]
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'running'") == 10

"""The plain claim's plan (lease.sql, `claim` and `claim_settings`): a worker plans it once per
connection, and that generic plan reads what a plan made for the claim's parameters reads, however
deep the queue. The worker's sessions force custom plans for every other statement: planning the
claim for its parameters cost about as much as running it when it claims a few tasks."""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg
import pytest
from psycopg import sql

from queueworker import enqueue_many
from queueworker.db import statements
from queueworker.db.connection import DutyConnection
from queueworker.db.lease import CLAIM, ClaimParams
from queueworker.runtime.worker import PLAIN_CLAIM_SETTINGS
from tests.support import numbered

pytestmark = pytest.mark.integration


def claim_params(limit: int) -> ClaimParams:
    return ClaimParams(queue="default", limit=limit, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60)


def enqueue(dsn: str, tasks: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [{"task": "t"} for _ in range(tasks)])
        conn.execute("VACUUM ANALYZE queueworker.tasks_active")


@pytest.mark.parametrize("wait_for_disk", [False, True])
def test_a_worker_plans_its_plain_claim_once_per_connection(dsn, wait_for_disk):
    """As a worker claims (its duty connection, its claim's settings sent first): the prepared claim
    has generic plans only, with asynchronous commits or without (--no-async-claim-commit)."""
    enqueue(dsn, 50)

    async def claims() -> list[tuple[int, int]]:
        claimer = DutyConnection(dsn, "test-claimer", prepare=True)

        async def plans(conn: psycopg.AsyncConnection) -> list[tuple[int, int]]:
            cursor = await conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                                        " WHERE statement LIKE '%%picked AS MATERIALIZED%%'")  # CLAIM, as sent
            return await cursor.fetchall()
        try:
            for _ in range(4):
                rows = await claimer.fetch(CLAIM, claim_params(10), first=PLAIN_CLAIM_SETTINGS[wait_for_disk])
                assert len(rows) == 10
            return await claimer.using(plans)
        finally:
            await claimer.close()

    [(generic, custom)] = asyncio.run(claims())
    assert custom == 0
    assert generic >= 1


def explained(conn: psycopg.Connection, plan_mode: str, params: ClaimParams) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS) of the prepared claim, run as the worker runs it (its settings
    first) under `plan_mode`, in a transaction rolled back so that each measure claims the same rows."""
    with conn.transaction(force_rollback=True):
        statements.execute(conn, PLAIN_CLAIM_SETTINGS[False].statement, PLAIN_CLAIM_SETTINGS[False].params)
        conn.execute(sql.SQL("SET LOCAL plan_cache_mode = {}").format(sql.Literal(plan_mode)))
        values = CLAIM.bind(params)
        [[plan]] = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE plain_claim ({})").format(
            sql.SQL(", ").join(sql.Literal(values[name]) for name in numbered(CLAIM.text)[1]))).fetchall()
    return (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]


def nodes(node: dict) -> list[dict]:
    return [node, *(found for child in node.get("Plans", ()) for found in nodes(child))]


def test_the_generic_plan_reads_what_a_custom_plan_reads_at_a_backlog_of_twenty_thousand(dsn):
    """20,000 tasks waiting, a claim of 10. A generic plan cannot know the LIMIT: had the claim
    joined `picked` to the table, the planner would size that join at a tenth of the table and hash
    the whole partition (a sequential scan of 20,000 rows for 10). It takes its rows by primary key
    instead, so the generic plan reads about what the plan made for LIMIT 10 reads."""
    enqueue(dsn, 20_000)
    with psycopg.connect(dsn, prepare_threshold=None) as conn:
        conn.pgconn.prepare(b"plain_claim", numbered(CLAIM.text)[0].encode())
        params = claim_params(10)
        buffers = {}
        for mode in ("force_custom_plan", "force_generic_plan"):
            explained(conn, mode, params)  # warm
            plan = explained(conn, mode, params)
            scans = {node["Node Type"] for node in nodes(plan)}
            assert "Seq Scan" not in scans and "Hash Join" not in scans, (mode, scans)
            buffers[mode] = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
            assert plan["Actual Rows"] == 10
    print(f"buffers of a claim of 10 at 20,000 waiting: {buffers}")
    assert buffers["force_generic_plan"] <= 1.5 * buffers["force_custom_plan"]

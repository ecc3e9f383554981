"""The controller's database side against a real Postgres: coalesced depth reads, caps, timeouts,
errors and the LISTEN shortcut."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from queueworker.producer import enqueue_many
from queueworker_controller import queuedb
from queueworker_controller.policy import QueueDepth
from queueworker_controller.queuedb import QueueDatabases

pytestmark = pytest.mark.integration


def enqueue(dsn: str, queue: str, count: int) -> None:
    with psycopg.connect(dsn) as conn:
        enqueue_many(conn, [{"task": "qw.noop", "queue": queue} for _ in range(count)])


def test_depth_reads_on_one_database_share_one_query(dsn, monkeypatch):
    enqueue(dsn, "a", 5)
    enqueue(dsn, "b", 50)
    queries = []
    original = queuedb._DepthBatch._query
    monkeypatch.setattr(queuedb._DepthBatch, "_query", lambda self: queries.append(1) or original(self))
    databases = QueueDatabases()

    async def read_both():
        return await asyncio.gather(databases.depth(dsn, "a", 100), databases.depth(dsn, "b", 10),
                                    databases.depth(dsn, "empty", 10))
    try:
        a, b, empty = asyncio.run(read_both())
    finally:
        databases.close()
    assert len(queries) == 1
    assert (a.ready, a.running) == (5, 0)
    assert b.ready == 50  # the batch's cap is the highest asked for (100)
    assert empty == QueueDepth(0, 0, 0, None)


def test_ready_count_is_capped(dsn):
    enqueue(dsn, "big", 30)
    databases = QueueDatabases()
    try:
        depth = asyncio.run(databases.depth(dsn, "big", 11))
    finally:
        databases.close()
    assert depth.ready == 11 and depth.oldest_ready_age_seconds is not None


def test_sessions_have_a_statement_timeout(dsn):
    pool = QueueDatabases().pool(dsn)
    with pool.connection() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "2s"
    pool.close()


def test_unreachable_database_fails_fast_for_every_waiter():
    databases = QueueDatabases()
    dead = "postgresql://nobody@127.0.0.1:1/none"

    async def read_two():
        return await asyncio.gather(databases.depth(dead, "a", 1), databases.depth(dead, "b", 1),
                                    return_exceptions=True)
    started = time.monotonic()
    results = asyncio.run(read_two())
    assert all(isinstance(r, psycopg.OperationalError) for r in results)
    assert time.monotonic() - started < queuedb.CONNECT_TIMEOUT_SECONDS + 1


def test_listen_notices_new_tasks(dsn):
    databases = QueueDatabases()

    async def scenario():
        databases.listen(dsn)
        await asyncio.sleep(0.5)  # let the LISTEN connection come up
        before = time.monotonic()
        await asyncio.to_thread(enqueue, dsn, "wake", 1)
        for _ in range(50):
            if databases.notified_since(dsn, "wake", before):
                return True
            await asyncio.sleep(0.05)
        return False
    try:
        assert asyncio.run(scenario())
        assert not databases.notified_since(dsn, "other", 0)
    finally:
        databases.close()


def test_reads_arriving_during_a_query_share_the_next_one(dsn, monkeypatch):
    queries = []
    original = queuedb._DepthBatch._query

    def slow_query(self):
        queries.append(sorted(self._waiters))
        time.sleep(0.3)
        return original(self)
    monkeypatch.setattr(queuedb._DepthBatch, "_query", slow_query)
    databases = QueueDatabases()

    async def staggered():
        first = asyncio.ensure_future(databases.depth(dsn, "a", 5))
        await asyncio.sleep(0.1)  # the first query is running now
        later = [asyncio.ensure_future(databases.depth(dsn, q, 5)) for q in ("b", "c")]
        await asyncio.sleep(0.1)
        later.append(asyncio.ensure_future(databases.depth(dsn, "d", 5)))
        return await asyncio.gather(first, *later)
    try:
        assert len(asyncio.run(staggered())) == 4
    finally:
        databases.close()
    assert queries == [["a"], ["b", "c", "d"]]

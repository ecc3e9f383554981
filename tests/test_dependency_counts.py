"""Dependencies settled by counts (migration 013): no global lock, so a big graph's open
transaction holds up no other completion; graphs in flight at version 12 carry on after the
upgrade; real worker processes racing producer processes release every dependent, never early."""

from __future__ import annotations

import multiprocessing
import random

import psycopg
import pytest

from queueworker import enqueue, enqueue_many
from queueworker.db.migrate import migrate
from tests.schema_history import insert_plain_tasks, migrate_to
from tests.support import WorkerProcess, query, wait_until
from tests.test_dependencies import claim, states, succeed

pytestmark = pytest.mark.integration


def test_a_big_graphs_open_transaction_holds_up_no_other_completion(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        prerequisite = enqueue(conn, "p", queue="big")
        other = enqueue(conn, "other")
        after_other = enqueue(conn, "after", depends_on=[other])
        tokens = claim(conn)
    with psycopg.connect(dsn) as graph:
        graph.execute("SET CONSTRAINTS ALL IMMEDIATE")  # settles each dependent now, inside the transaction
        enqueue_many(graph, [{"task": "d", "depends_on": [prerequisite]}] * 500)
        with psycopg.connect(dsn, autocommit=True) as worker:
            worker.execute("SET statement_timeout = '10s'")
            succeed(worker, other, tokens)
        assert states(dsn, [other, after_other]) == ["succeeded", "pending"]
        graph.rollback()


def test_graphs_in_flight_at_version_12_carry_on_after_the_upgrade(blank_dsn):
    migrate_to(blank_dsn, 12)
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        p1, p2, p3 = insert_plain_tasks(conn, [("default", "p", {})] * 3)
        d1 = enqueue(conn, "d1", depends_on=[p1, p2])
        d2 = enqueue(conn, "d2", depends_on=[p3])
        d3 = enqueue(conn, "d3", depends_on=[d2])
        d4 = enqueue(conn, "d4", depends_on=[p3], on_dependency_failure="run")
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() WHERE id = %s", (p1,))
        conn.execute("UPDATE queueworker.tasks SET state = 'failed', finished_at = now() WHERE id = %s", (p3,))
    assert states(blank_dsn, [d1, d2, d3, d4]) == ["blocked", "cancelled", "cancelled", "pending"]

    migrate(blank_dsn)

    assert query(blank_dsn, "SELECT id, prerequisites_waiting, prerequisites_failed FROM queueworker.tasks "
                            "WHERE id = ANY(%s) ORDER BY id", ([d1, d2, d3],)) == [(d1, 1, 0), (d2, 0, 1), (d3, 0, 1)]
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() WHERE id = %s", (p2,))
        assert states(blank_dsn, [d1]) == ["pending"]
        conn.execute("UPDATE queueworker.tasks SET state = 'pending', finished_at = NULL WHERE id = %s", (p3,))
        assert states(blank_dsn, [d2, d3, d4]) == ["blocked", "blocked", "pending"]
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() WHERE id = %s", (p3,))
        assert states(blank_dsn, [d2, d3]) == ["pending", "blocked"]


def _add_dependents(dsn: str, prerequisites: list[int], seed: int, started, results) -> None:
    """Enqueues dependents of random prerequisites, some in transactions that take a while, while
    workers complete them."""
    rng = random.Random(seed)
    made = []
    with psycopg.connect(dsn) as conn:
        started.wait()
        for _ in range(100):
            made.append(enqueue(conn, "qw.noop", queue="dependents",
                                depends_on=rng.sample(prerequisites, rng.randint(1, 4))))
            if rng.random() < 0.3:
                conn.execute("SELECT pg_sleep(0.002)")
            conn.commit()
    results.put(made)


def test_workers_racing_producers_release_every_dependent_and_none_early(dsn):
    """Prerequisites are completed in batches by worker processes while three producer processes
    add dependents of them: every dependent runs, and only after all its prerequisites finished."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        prerequisites = enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": 0.01}}] * 400)
    context = multiprocessing.get_context("spawn")
    started, results = context.Barrier(4), context.Queue()
    producers = [context.Process(target=_add_dependents, args=(dsn, prerequisites, seed, started, results))
                 for seed in range(3)]
    for producer in producers:
        producer.start()
    workers = [WorkerProcess(dsn, "--concurrency", "16", "--queue", "default", "--queue", "dependents") for _ in range(2)]
    try:
        started.wait()
        for producer in producers:
            producer.join(120)
            assert producer.exitcode == 0
        dependents = [task_id for _ in producers for task_id in results.get(timeout=5)]
        wait_until(lambda: set(states(dsn, prerequisites + dependents)) == {"succeeded"}, timeout=120,
                   message="every prerequisite and dependent to succeed")
    finally:
        for worker in workers:
            worker.stop()
    early = query(dsn, """
        SELECT t.id FROM queueworker.tasks t
        JOIN queueworker.task_dependencies d ON d.task_id = t.id
        JOIN queueworker.tasks p ON p.id = d.prerequisite_id
        WHERE t.id = ANY(%s) AND t.started_at < p.finished_at""", (dependents,))
    assert early == [] and len(dependents) == 300

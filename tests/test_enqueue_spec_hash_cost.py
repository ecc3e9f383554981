"""What the spec hash costs a bulk enqueue: the expression is computed in the statement that inserts
(queueworker.spec_hash inlined), and the unique/dependent enqueue (queueworker.enqueue_tasks, which
the SQL producer API calls too) sets it itself, so no row trigger runs per task. The hashes stay
those of the canonical spec (tests/test_unique_tasks.py checks the digest itself). Against a real
Postgres."""

from __future__ import annotations

import json

import psycopg
import pytest

from queueworker import TaskSpec, enqueue_many

pytestmark = pytest.mark.integration

# Row triggers are PL/pgSQL: with track_functions = 'pl' (superuser only) the calls of each show in
# pg_stat_xact_user_functions, those of the transaction and of earlier ones not yet flushed.
TRIGGER_CALLS = ("SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions "
                 "WHERE schemaname = 'queueworker' AND funcname = 'fill_spec_hash'")
RIGHT_HASHES = ("SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) "
                "AND spec_hash = sha256(convert_to(jsonb_build_array(queue, task, payload)::text, 'UTF8'))")


def test_a_statement_computes_the_spec_hash_itself(dsn):
    """The planner inlines queueworker.spec_hash: the plan holds its expression, not a call per row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        plan = "\n".join(row[0] for row in conn.execute(
            "EXPLAIN (VERBOSE) SELECT queueworker.spec_hash('q', 't' || g, '{}') FROM generate_series(1, 2) AS g"))
    assert "sha256" in plan and "spec_hash(" not in plan, plan


@pytest.mark.parametrize("path", ["python", "sql"])
def test_unique_and_dependent_tasks_are_hashed_without_a_row_trigger(dsn, path):
    """queueworker.enqueue_tasks sets each row's spec hash in its insert, through the library's
    unique and dependent specs and through the SQL producer's queueworker.enqueue_many alike."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET track_functions = 'pl'")
        first = enqueue_many(conn, [TaskSpec(task="first")])[0]
        specs = [{"task": "t", "payload": {"n": n, "text": "é\"\\"}, "dedupe_key": f"k{n}"} for n in range(50)]
        specs += [{"task": "after", "queue": "q2", "depends_on": [first]}, {"task": "same", "dedupe": "spec"}]
        conn.commit()
        before = conn.execute(TRIGGER_CALLS).fetchone()[0]  # the counts are flushed between transactions only
        if path == "python":
            ids = enqueue_many(conn, specs)
        else:
            ids = conn.execute("SELECT queueworker.enqueue_many(%s::jsonb)", (json.dumps(specs),)).fetchone()[0]
        assert conn.execute(TRIGGER_CALLS).fetchone()[0] == before, "a row trigger filled the spec hash"
        conn.commit()
        assert conn.execute(RIGHT_HASHES, (ids,)).fetchone()[0] == len(specs)

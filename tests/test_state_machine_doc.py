"""docs/state-machine.md must stay true to the code: every documented task transition is one the
SQL really makes (and no other), and the worker-state table names exactly the State enum."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from queueworker import sql
from queueworker.producer import enqueue
from queueworker.worker import State
from tests.support import query

DOC = Path(__file__).resolve().parent.parent / "docs" / "state-machine.md"




def _first_table(heading: str) -> list[list[str]]:
    section = DOC.read_text().split(heading, 1)[1]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if not set(line) <= set("|- :"):
            table.append([cell.strip() for cell in line.strip("|").split("|")])
    return table[1:]


def documented_task_transitions() -> set[tuple[str, str]]:
    return {("" if row[0] == "(none)" else row[0], row[1]) for row in _first_table("## Task states")}


def test_worker_state_table_names_the_state_enum():
    documented = {cell for row in _first_table("## Worker process states") for cell in row[:2]}
    assert documented == {state.value for state in State}


@pytest.mark.integration
def test_documented_task_transitions_are_exactly_the_ones_the_sql_makes(dsn):
    worker = uuid.uuid4()
    claim = {"queue": "default", "worker": worker, "lease_seconds": 30, "timeout_seconds": 60}
    rescue = {"lock_key": sql.RESCUER_LOCK_KEY, "deadline_grace": 0, "worker_ttl": 60, "limit": 100}

    def claimed_token(conn, task_id):
        rows = conn.execute(sql.CLAIM, {**claim, "limit": 100}).fetchall()
        return next(r[6] for r in rows if r[0] == task_id)

    def fail(conn, task_id, token, retryable):
        conn.execute(sql.COMPLETE_FAILED, {"ids": [task_id], "tokens": [token], "retryables": [retryable],
                                           "backoffs": [0.0], "errors": [Jsonb({"message": "x"})]})

    def expire(conn, task_id):
        conn.execute("UPDATE queueworker.tasks SET leased_until = now() - interval '1s' WHERE id = %s", (task_id,))

    with psycopg.connect(dsn, autocommit=True) as conn:
        ok = enqueue(conn, "qw.noop")
        conn.execute(sql.COMPLETE_SUCCEEDED, {"ids": [ok], "tokens": [claimed_token(conn, ok)], "results": [None]})

        retried = enqueue(conn, "qw.noop", max_attempts=2)
        fail(conn, retried, claimed_token(conn, retried), retryable=True)               # running -> retrying
        conn.execute(sql.PROMOTE_DUE, {"lock_key": sql.SCHEDULER_LOCK_KEY, "limit": 10})  # retrying -> pending
        fail(conn, retried, claimed_token(conn, retried), retryable=True)               # attempts spent -> failed
        conn.execute(sql.RETRY_TASK, {"id": retried})                                   # failed -> pending

        released = enqueue(conn, "qw.noop")
        conn.execute(sql.RELEASE, {"ids": [released], "tokens": [claimed_token(conn, released)]})

        rescued = enqueue(conn, "qw.noop", max_attempts=2)
        claimed_token(conn, rescued)
        expire(conn, rescued)
        conn.execute(sql.RESCUE, rescue)                                                # running -> pending
        claimed_token(conn, rescued)
        expire(conn, rescued)
        conn.execute(sql.RESCUE, rescue)                                                # running -> failed

        for doomed_state in ("pending", "retrying", "running"):
            doomed = enqueue(conn, "qw.noop")
            if doomed_state != "pending":
                token = claimed_token(conn, doomed)
                if doomed_state == "retrying":
                    conn.execute(sql.COMPLETE_FAILED, {"ids": [doomed], "tokens": [token], "retryables": [True],
                                                       "backoffs": [3600.0], "errors": [Jsonb({"message": "x"})]})
            conn.execute(sql.CANCEL_TASK, {"id": doomed})
        conn.execute(sql.RETRY_TASK, {"id": doomed})                                    # cancelled -> pending

    seen = {(from_state or "", to_state) for from_state, to_state in query(
        dsn, "SELECT DISTINCT from_state::text, to_state::text FROM queueworker.task_events")}
    assert seen == documented_task_transitions()

"""What the parts of a task's database work cost: the raw-SQL ceiling without them (queueworker only).

    .venv/bin/python -m bench.ceiling_parts [--tasks 50000] [--rounds 3]

The raw-SQL ceiling of `python -m bench` (pgbench, 2 clients looping the claim of 100 and the
completion of what it claimed, bench/history.py) run with five texts of the two statements,
alternating, a fresh database each, the tasks enqueued before: as they are; without the audit rows
(the `audited` step of both); without the move into the history (the completion deletes the rows
and inserts nothing into `tasks_finished`); without either; and with one audit row per statement
instead of one per task (a sketch of a cheaper form, in a table made for the measurement: the
statement's task ids in an array under a GIN index, so that a task's history can still be found).
Tasks/s is the pgbench wall time over the task count, and the WAL each task writes is read from
`pg_current_wal_lsn()` around it. None of the four others is something queueworker could ship as
it is (each drops or changes a record it keeps): they say what the present form of each record
costs, so what a cheaper form of it could win.
"""

from __future__ import annotations

import argparse
import re
import statistics

import psycopg

from bench.history import claim_script, run_pgbench, seed_noop_tasks
from bench.queueworker_bench import fresh_database
from queueworker.db.lease import CLAIM, COMPLETE_SUCCEEDED, claim_function_statement
from queueworker.dev.localpg import LocalPostgres

CLIENTS, LIMIT = 2, 100
# The sketch's table, made in each measured database (its audit rows per statement).
BATCHED_EVENTS = """
    CREATE TABLE queueworker.task_event_batches (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), worker uuid,
        from_state queueworker.task_state, to_state queueworker.task_state NOT NULL, task_ids bigint[] NOT NULL,
        lease_tokens bigint[] NOT NULL, details jsonb[], by_user text DEFAULT SESSION_USER)
    WITH (autovacuum_vacuum_insert_scale_factor = '0.05');
    CREATE INDEX task_event_batches_tasks ON queueworker.task_event_batches USING gin (task_ids)"""


def _cut(text: str, pattern: str, replacement: str) -> str:
    """`text` with the one match of `pattern` replaced; fails when the statement no longer has it."""
    cut, count = re.subn(pattern, replacement, text, flags=re.S)
    if count != 1:
        raise RuntimeError(f"statement changed: {pattern!r} matched {count} times")
    return cut


def variants() -> dict[str, tuple[str, str]]:
    """Claim and completion texts per variant."""
    claim, complete = claim_function_statement(CLAIM), COMPLETE_SUCCEEDED.text
    claim_unaudited = _cut(claim, r"\), audited AS \(.*?FROM claimed\n\)", ")")
    complete_unaudited = _cut(complete, r"\), audited AS \(.*?FROM done\n\), settled", "), settled")

    def unmoved(text: str) -> str:
        return _cut(text, r"\), moved AS \(.*?RETURNING id, lease_token\n\)",
                    "), moved AS (SELECT id, lease_token FROM done)")

    claim_batched = _cut(claim, r"audited AS \(.*?FROM claimed\n\)", """audited AS (
    INSERT INTO queueworker.task_event_batches (worker, from_state, to_state, task_ids, lease_tokens, details)
    SELECT %(worker)s, 'pending', 'running', array_agg(id), array_agg(lease_token),
           array_agg(jsonb_build_object('attempts', attempts))
    FROM claimed HAVING count(*) > 0
)""")
    complete_batched = _cut(complete, r"audited AS \(.*?FROM done\n\), settled", """audited AS (
    INSERT INTO queueworker.task_event_batches (worker, from_state, to_state, task_ids, lease_tokens, details)
    SELECT (array_agg(lease_owner))[1], 'running', 'succeeded', array_agg(id), array_agg(lease_token),
           array_agg(queueworker.transition_detail(attempts, NULL, error))
    FROM done HAVING count(*) > 0
), settled""")
    return {"as is": (claim, complete), "no audit rows": (claim_unaudited, complete_unaudited),
            "no history move": (claim, unmoved(complete)),
            "neither": (claim_unaudited, unmoved(complete_unaudited)),
            "audit per statement": (claim_batched, complete_batched)}


def measure(dsn: str, claim_text: str, complete_text: str, tasks: int) -> tuple[float, float]:
    """Tasks/s and WAL bytes per task of one pgbench drain of `tasks` tasks (their enqueue not counted)."""
    seed_noop_tasks(dsn, tasks)
    with psycopg.connect(dsn, autocommit=True) as conn:
        start_lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    seconds = run_pgbench(dsn, claim_script(claim_text, complete_text), tasks, CLIENTS, LIMIT)
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM queueworker.tasks_active").fetchone()[0]
        wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (start_lsn,)).fetchone()[0]
    if left:
        raise RuntimeError(f"{left} tasks left unfinished")
    return tasks / seconds, float(wal) / tasks


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ceiling_parts", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = LocalPostgres(durable=True)
    admin = server.start()
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        for round_no in range(args.rounds):
            for name, (claim_text, complete_text) in variants().items():
                dsn = fresh_database(admin, "ceiling_parts")
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(BATCHED_EVENTS)
                rate, wal = measure(dsn, claim_text, complete_text, args.tasks)
                results.setdefault(name, []).append((rate, wal))
                print(f"round {round_no + 1} {name:<16} {rate:>9,.0f} tasks/s  {wal:>6,.0f} WAL bytes/task", flush=True)
    finally:
        server.stop()
    base = statistics.median(rate for rate, _ in results["as is"])
    for name, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        print(f"median {name:<16} {rate:>9,.0f} tasks/s ({rate / base:.2f}×)  "
              f"{statistics.median(w for _, w in runs):>6,.0f} WAL bytes/task")


if __name__ == "__main__":
    main()

"""Scenario 3 (scale of history) and the raw-SQL ceiling, both queueworker-only.

History rows are written with one INSERT ... SELECT generate_series each (finished and
delayed), with triggers off for that statement only (session_replication_role = replica), so
the synthetic history has no audit rows; the measured tasks go through the triggers as usual.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from queueworker.db import statements
from queueworker.db.lease import CLAIM, COMPLETE_SUCCEEDED, ClaimParams, claim_function_statement


def find_pgbench(bin_dir: Path | None = None) -> Path | None:
    """pgbench beside the server binaries, else the newest Debian one, else None."""
    candidates = [bin_dir / "pgbench"] if bin_dir else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True)
    return next((c for c in candidates if c.exists()), None)


def build_history(dsn: str, finished: int, delayed: int) -> float:
    """Adds `finished` succeeded rows and `delayed` pending rows due in a day; returns seconds taken."""
    t0 = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("""
            INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, lease_token, created_at, updated_at,
                                           started_at, finished_at, spec_hash)
            SELECT 'default', 'qw.noop', 'succeeded', false, 1, 1, ts, ts, ts, ts,
                   queueworker.spec_hash('default', 'qw.noop', '{}')
            FROM (SELECT now() - interval '30 days' + g * interval '200 ms' AS ts
                  FROM generate_series(1, %s) g) s""", (finished,))
        conn.execute("""
            INSERT INTO queueworker.tasks (queue, task, run_after, delayed, spec_hash)
            SELECT 'default', 'qw.noop', now() + interval '1 day' + g * interval '50 ms', true,
                   queueworker.spec_hash('default', 'qw.noop', '{}')
            FROM generate_series(1, %s) g""", (delayed,))
        conn.execute("RESET session_replication_role")
        conn.execute("VACUUM ANALYZE queueworker.tasks")
    return time.monotonic() - t0


def idle_claim_cost(dsn: str, repeats: int = 20) -> dict:
    """Cost of one claim (limit 100) when nothing is due: what every idle poll pays."""
    params = ClaimParams(queue="default", limit=100, worker=uuid.uuid4(), lease_seconds=30.0, timeout_seconds=1800)
    with psycopg.connect(dsn) as conn:
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM.text,
                            CLAIM.bind(params)).fetchone()[0][0]
        conn.rollback()
        t0 = time.perf_counter()
        for _ in range(repeats):
            rows = statements.fetch(conn, CLAIM, params)
            conn.rollback()
            assert not rows
        ms = (time.perf_counter() - t0) * 1000 / repeats
    buffers = _sum_buffers(plan["Plan"])
    return {"claim_ms": ms, "buffers": buffers}


def _sum_buffers(node: dict) -> int:
    return node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)


def claim_script(claim_text: str | None = None, complete_text: str = COMPLETE_SUCCEEDED.text) -> str:
    """pgbench script: our claim's statement (by default what queueworker.claim_tasks runs, its rows aggregated
    into arrays) then our complete_succeeded verbatim, placeholders turned into pgbench variables;
    the claim commits without waiting for the disk with a generic plan, as the function does
    (migrations/functions/35_claims.sql), the completion waits. Other texts of the two statements
    (bench/ceiling_parts.py) go through the same script."""
    head, _ = (claim_text or claim_function_statement(CLAIM)).rsplit("\nSELECT ", 1)
    claim = (f"{head}\n"
             "SELECT coalesce(array_agg(id), '{}')::text AS ids, "
             "coalesce(array_agg(lease_token), '{}')::text AS tokens, "
             "array_fill(NULL::jsonb, ARRAY[count(*)::int])::text AS results FROM claimed")

    def to_pgbench(statement: str) -> str:
        statement = re.sub(r"%\((\w+)\)s", r":\1", statement)
        return " ".join(statement.split())

    return (f"SET synchronous_commit = off;\nSET plan_cache_mode = force_generic_plan;\n{to_pgbench(claim)}\n\\gset\n"
            f"SET synchronous_commit = on;\nSET plan_cache_mode = force_custom_plan;\n{to_pgbench(complete_text)};\n")


def seed_noop_tasks(dsn: str, tasks: int) -> None:
    """`tasks` waiting no-op tasks in queue `default`, for run_pgbench."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queueworker.tasks (queue, task, delayed) "
                     "SELECT 'default', 'qw.noop', false FROM generate_series(1, %s)", (tasks,))
        conn.execute("VACUUM ANALYZE queueworker.tasks")


def run_pgbench(dsn: str, script_text: str, tasks: int, clients: int, limit: int, pgbench: Path | None = None) -> float:
    """Has pgbench clients loop `script_text` (claim(limit) + completion) until the `tasks` tasks
    seeded by seed_noop_tasks are all claimed; returns pgbench's wall time in seconds."""
    pgbench = pgbench or find_pgbench()
    if pgbench is None:
        raise RuntimeError("pgbench not found")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    per_client = -(-tasks // (clients * limit))
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(script_text)
    cmd = [str(pgbench), "-n", "-M", "prepared", "-h", info["host"], "-p", str(info["port"]),
           "-U", info.get("user", "postgres"), "-c", str(clients), "-j", str(clients), "-t", str(per_client),
           "-D", "queue=default", "-D", f"limit={limit}", "-D", f"worker={uuid.uuid4()}",
           "-D", "lease_seconds=30", "-D", "timeout_seconds=1800", "-f", script.name, info["dbname"]]
    # The password goes by environment, never argv (other local users can read argv).
    env = {**os.environ, **({"PGPASSWORD": info["password"]} if info.get("password") else {})}
    started = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    seconds = time.perf_counter() - started
    Path(script.name).unlink()
    if out.returncode != 0:
        raise RuntimeError(f"pgbench failed: {out.stderr.strip() or out.stdout.strip()}")
    return seconds


def ceiling(dsn: str, tasks: int, clients: int, limit: int, pgbench: Path | None = None) -> dict:
    """Tasks/s of pgbench clients looping claim(limit) + complete_succeeded over `tasks` rows."""
    seed_noop_tasks(dsn, tasks)
    run_pgbench(dsn, claim_script(), tasks, clients, limit, pgbench)
    with psycopg.connect(dsn) as conn:
        first, last, done = conn.execute("""
            SELECT min(started_at), max(finished_at), count(*) FILTER (WHERE state = 'succeeded')
            FROM queueworker.tasks WHERE finished_at IS NOT NULL""").fetchone()
    if done != tasks:
        raise RuntimeError(f"pgbench ceiling: {done} of {tasks} succeeded")
    return {"tasks_per_s": tasks / (last - first).total_seconds(), "clients": clients, "limit": limit}

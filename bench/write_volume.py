"""What each system writes per task it drains: WAL bytes and records, full-page images, row operations.

    .venv/bin/python -m bench.write_volume [--systems queueworker,graphile-worker,river,pgqueuer]
                                           [--tasks 20000] [--rounds 2]

Each system's no-op tasks are pre-enqueued in a fresh database (its own preload, as the burn-down's),
a CHECKPOINT is taken, then 2 worker processes of concurrency 100 drain them. Around the drain:
`pg_current_wal_lsn()` and `pg_stat_wal` (WAL bytes, records, full-page images) and the sum of
`pg_stat_user_tables` (rows inserted, updated, deleted, heap-only updates), per task. These counts
do not depend on the machine's speed, so one round says what the burn-down's Postgres CPU per task
comes from; `--rounds` only shows they repeat.
"""

from __future__ import annotations

import argparse
import time

import psycopg

from bench.scenarios import Workers
from bench.systems import ALL
from queueworker.dev.localpg import LocalPostgres

PROCESSES, CONCURRENCY = 2, 100
COUNTERS = """
    SELECT pg_current_wal_lsn(), (SELECT wal_records FROM pg_stat_wal), (SELECT wal_fpi FROM pg_stat_wal),
           sum(n_tup_ins), sum(n_tup_upd), sum(n_tup_del), sum(n_tup_hot_upd)
    FROM pg_stat_user_tables"""
FIELDS = ("WAL records", "full-page images", "rows inserted", "rows updated", "rows deleted", "heap-only updates")


def drain(system_name: str, dsn: str, tasks: int) -> dict[str, float]:
    """The counters' growth per task over one drain of `tasks` no-op tasks."""
    system = ALL[system_name]()
    system.install(dsn)
    system.preload_noop(dsn, tasks)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        conn.execute("SELECT pg_stat_force_next_flush()")
        before = conn.execute(COUNTERS).fetchone()
        workers = Workers.start(system, dsn, PROCESSES, CONCURRENCY)
        try:
            while conn.execute(system.remaining_sql).fetchone()[0]:
                time.sleep(0.1)
        finally:
            workers.stop()
        # The workers' backends report their table counters as they exit.
        deadline = time.monotonic() + 10
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid()").fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.1)
        after = conn.execute(COUNTERS).fetchone()
        wal = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (after[0], before[0])).fetchone()[0]
    return {"WAL bytes": float(wal) / tasks,
            **{name: float(a - b) / tasks for name, a, b in zip(FIELDS, after[1:], before[1:])}}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.write_volume", description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="queueworker,graphile-worker,river,pgqueuer")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    names = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = [name for name in names if name not in ALL]
    if unknown:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    server = LocalPostgres(durable=True)
    admin = server.start()
    try:
        for round_no in range(args.rounds):
            for name in names:
                dbname = f"write_volume_{round_no}_{name.replace('-', '_')}"
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{dbname}"')
                dsn = admin.rsplit("/", 1)[0] + "/" + dbname  # a URL: asyncpg takes no key=value DSNs
                per_task = drain(name, dsn, args.tasks)
                print(f"round {round_no + 1} {name:<16} " + ", ".join(
                    f"{field} {value:,.2f}" if value < 100 else f"{field} {value:,.0f}"
                    for field, value in per_task.items()), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()

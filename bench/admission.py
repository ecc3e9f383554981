"""How long the scheduler takes to admit due tasks, in a session that admitted a few first.

    .venv/bin/python -m bench.admission [--backlog 300000] [--batch 5000] [--passes 3] [--burst 20000]

A worker's scheduler admits delayed and retrying tasks whose time has come to the claim index in
passes of up to 5,000 (`promote_due`, through the parent table, so the audit and fair-share
statement triggers run). Those triggers pair each update's old rows with its new ones, and a
session plans their statements once, for the transition tables of its first update. Here, on a
durable throwaway server and a worker's session settings: `--backlog` due delayed tasks in a queue
(plain, then keyed over 100 keys), one pass admitting a single task (what plans the triggers), then
`--passes` passes of `--batch`: milliseconds per pass (median) and admitted tasks per second. Then
what a user sees of it, a delayed burst: 2 worker processes of 50 slots run; once they have
registered, `--burst` no-op tasks are enqueued due 5 s later, all at the same moment (a batch
scheduled for a time, or retries after an outage): seconds from that moment to the last task's end
(the database's clocks). Run it on two checkouts to compare the statements of each.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from bench.queueworker_bench import Workers, fresh_database, wait_drained
from queueworker.client.producer import TaskSpec, enqueue_many
from queueworker.db import statements
from queueworker.db.connection import SESSION_SETTINGS
from queueworker.db.duties import PROMOTE_DUE, PromoteDueParams
from queueworker.dev.localpg import LocalPostgres


def passes(admin: str, backlog: int, batch: int, count: int, keyed: bool) -> list[float]:
    """Seconds of each pass of `batch`, after one pass of a single task in the same session."""
    dsn = fresh_database(admin, "admission")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queueworker.tasks (queue, task, key, run_after, delayed) "
                     "SELECT 'q', 't', CASE WHEN %s THEN 'k' || (n %% 100) END, now() - interval '1 minute', true "
                     "FROM generate_series(1, %s) AS n", (keyed, backlog))
        conn.execute("VACUUM ANALYZE queueworker.tasks_active")
    seconds = []
    with psycopg.connect(dsn, autocommit=True, options=SESSION_SETTINGS, prepare_threshold=1) as conn:
        statements.fetch(conn, PROMOTE_DUE, PromoteDueParams(limit=1))
        for _ in range(count):
            started = time.perf_counter()
            [row] = statements.fetch(conn, PROMOTE_DUE, PromoteDueParams(limit=batch))
            seconds.append(time.perf_counter() - started)
            if row.promoted != batch:
                raise RuntimeError(f"a pass admitted {row.promoted} of {batch}: make --backlog larger")
    return seconds


def delayed_burst(admin: str, tasks: int) -> float:
    """Seconds from the moment `tasks` delayed no-op tasks become due to the last one's end."""
    dsn = fresh_database(admin, "admission_burst")
    workers = Workers.start(dsn, 2, 50)
    try:
        workers.wait_registered(dsn)
        with psycopg.connect(dsn) as conn:
            due = conn.execute("SELECT now() + interval '5 seconds'").fetchone()[0]
            enqueue_many(conn, [TaskSpec(task="qw.noop", run_after=due)] * tasks)
            conn.commit()
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_drained(conn)
    finally:
        workers.stop()
    with psycopg.connect(dsn, autocommit=True) as conn:
        last, done = conn.execute("SELECT max(finished_at), count(*) FILTER (WHERE state = 'succeeded') "
                                  "FROM queueworker.tasks").fetchone()
    if done != tasks:
        raise RuntimeError(f"only {done} of {tasks} succeeded")
    return (last - due).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--burst", type=int, default=20_000)
    args = parser.parse_args()
    server = LocalPostgres(durable=True)
    admin = server.start()
    try:
        for keyed in (False, True):
            taken = passes(admin, args.backlog, args.batch, args.passes, keyed)
            median = statistics.median(taken)
            print(f"{'keyed' if keyed else 'plain'} queue: a pass of {args.batch:,} takes {median * 1000:,.0f} ms "
                  f"(median of {len(taken)}: {', '.join(f'{s * 1000:,.0f}' for s in taken)}), "
                  f"{args.batch / median:,.0f} tasks admitted per second")
        if args.burst:
            seconds = delayed_burst(admin, args.burst)
            print(f"delayed burst: {args.burst:,} tasks due at once all ended {seconds:,.1f} s after they were due "
                  f"({args.burst / seconds:,.0f} tasks/s)")
    finally:
        server.destroy()


if __name__ == "__main__":
    main()

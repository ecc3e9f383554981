"""The console's pages timed on a large history: N finished tasks (default 10M: 97% succeeded, 2%
failed, 1% cancelled, over eight queues, finished over the last week and the newest within the last
minutes), audit rows for the newest 100,000 of them, 10,000 pending and 200 running tasks, a
registered worker and 1,000 runs. Each page is requested through the ASGI app (in process, over
Starlette's TestClient) several times after one warm-up; the median is printed as a markdown table.

    .venv/bin/python -m bench.console_timings [--finished 10000000] [--repeat 7]

Rows are bulk-inserted with SQL (audit trigger off while loading, spec hashes given), then VACUUM
ANALYZE, as autovacuum would do on such a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

import psycopg
from starlette.testclient import TestClient

from queueworker.console import ConsoleConfig, create_app
from queueworker.db import statements
from queueworker.db.lease import CLAIM, HEARTBEAT, ClaimParams, HeartbeatParams
from queueworker.db.migrate import migrate
from queueworker.db.runs import START_RUN, StartRunParams
from queueworker.dev.localpg import LocalPostgres

CHUNK = 1_000_000
QUEUES = [f"queue-{n}" for n in range(7)] + ["rare"]  # `rare` gets one task in 10,000
EVENTS_FOR = 100_000
PENDING, RUNNING, RUNS = 10_000, 200, 1_000

FINISHED = """
INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, payload, result, error, dedupe_key, spec_hash,
                               created_at, run_after, started_at, finished_at, updated_at)
SELECT CASE WHEN g %% 10000 = 0 THEN 'rare' ELSE 'queue-' || (g %% 7) END, 'task_' || (g %% 13),
       (CASE WHEN g %% 100 < 97 THEN 'succeeded' WHEN g %% 100 < 99 THEN 'failed' ELSE 'cancelled' END)::queueworker.task_state,
       false, 1, jsonb_build_object('n', g, 'customer', 'c-' || (g %% 5000)),
       CASE WHEN g %% 100 < 97 THEN jsonb_build_object('ok', true) END,
       CASE WHEN g %% 100 >= 97 THEN jsonb_build_object('type', 'Boom', 'message', 'failed ' || g) END,
       'key-' || g, '\\x00'::bytea, f.at - interval '2 seconds', f.at - interval '2 seconds', f.at - interval '1 second',
       f.at, f.at
FROM generate_series(%(start)s::bigint, %(stop)s::bigint) AS g,
     LATERAL (SELECT now() - make_interval(secs => (%(total)s - g) * 604800.0 / %(total)s) AS at) AS f
"""


def load(conn: psycopg.Connection, finished: int) -> dict[str, int]:
    conn.execute("ALTER TABLE queueworker.tasks DISABLE TRIGGER tasks_audit_insert")
    started = time.monotonic()
    for start in range(1, finished + 1, CHUNK):
        stop = min(start + CHUNK - 1, finished)
        conn.execute(FINISHED, {"start": start, "stop": stop, "total": finished})
        conn.commit()
        print(f"  {stop:,} finished tasks ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    conn.execute("""INSERT INTO queueworker.task_events (task_id, from_state, to_state, at, lease_token, detail)
                    SELECT id, 'running', state, finished_at, 1, '{"attempts": 1}'::jsonb FROM queueworker.tasks
                    WHERE state IN ('succeeded', 'failed', 'cancelled') ORDER BY id DESC LIMIT %s""", (EVENTS_FOR,))
    conn.execute("""INSERT INTO queueworker.tasks (queue, task, delayed, payload)
                    SELECT 'queue-' || (g %% 7), 'task_' || (g %% 13), false, jsonb_build_object('n', g)
                    FROM generate_series(1, %s) AS g""", (PENDING,))
    conn.execute("ALTER TABLE queueworker.tasks ENABLE TRIGGER tasks_audit_insert")
    worker = uuid.uuid4()
    statements.fetch(conn, HEARTBEAT, HeartbeatParams(
        worker=worker, hostname="bench", pod_name="bench-0", pod_namespace="b", pid=1, queues=QUEUES,
        concurrency=RUNNING, running=0, draining=False, version="bench", lease_seconds=3600, ids=[], tokens=[],
        progresses=[]))
    statements.fetch(conn, CLAIM, ClaimParams(queue="queue-1", limit=RUNNING, worker=worker, lease_seconds=3600,
                                              timeout_seconds=7200))
    for n in range(RUNS):
        statements.fetch(conn, START_RUN, StartRunParams(name=f"export-{n % 10}", expected=1, on_success=None,
                                                         on_failure=None, watermark=None))
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE queueworker.tasks_finished")
    conn.execute("VACUUM ANALYZE queueworker.tasks_active")
    conn.execute("VACUUM ANALYZE queueworker.task_events")
    counts = dict(conn.execute("SELECT state::text, count(*) FROM queueworker.tasks GROUP BY state").fetchall())
    counts["task_events"] = conn.execute("SELECT count(*) FROM queueworker.task_events").fetchone()[0]
    return counts


def pages(finished: int) -> list[tuple[str, str]]:
    newest = finished  # the newest finished task's id
    return [
        ("queues", "/queues"),
        ("tasks (newest)", "/tasks"),
        ("tasks, state=failed", "/tasks?state=failed"),
        ("tasks, queue=rare (1 in 10,000)", "/tasks?queue=rare"),
        ("tasks, page deep in history", f"/tasks?before={finished // 2}"),
        ("tasks, pending of a queue", "/tasks?queue=queue-3&state=pending"),
        ("lookup by dedupe key", f"/tasks?key=key-{newest - 5}"),
        ("task page (with audit trail)", f"/tasks/{newest - 5}"),
        ("task page (oldest task)", "/tasks/1"),
        ("workers", "/workers"),
        ("runs", "/runs"),
        ("run page", f"/runs/{RUNS}"),
        ("scaling (no cluster)", "/scaling"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    server = LocalPostgres(extra_settings={"shared_buffers": "1GB", "max_wal_size": "8GB",
                                           "maintenance_work_mem": "512MB"})
    server.start()
    try:
        migrate(server.dsn)
        with psycopg.connect(server.dsn) as conn:
            started = time.monotonic()
            counts = load(conn, args.finished)
            print(f"loaded in {time.monotonic() - started:.0f} s: {counts}", file=sys.stderr)
        with TestClient(create_app(ConsoleConfig(server.dsn))) as client:
            rows = []
            for label, path in pages(args.finished):
                assert client.get(path).status_code == 200, path  # warm-up, and the page works
                times = []
                for _ in range(args.repeat):
                    began = time.perf_counter()
                    response = client.get(path)
                    times.append((time.perf_counter() - began) * 1000)
                    assert response.status_code == 200, path
                rows.append((label, path, statistics.median(times), max(times)))
    finally:
        server.destroy()
    print(f"{counts.get('succeeded', 0) + counts.get('failed', 0) + counts.get('cancelled', 0):,} finished tasks "
          f"({', '.join(f'{k} {v:,}' for k, v in sorted(counts.items()))}); median of {args.repeat} requests\n")
    print("| page | request | median ms | max ms |")
    print("| --- | --- | ---: | ---: |")
    for label, path, median, slowest in rows:
        print(f"| {label} | `{path}` | {median:.1f} | {slowest:.1f} |")


if __name__ == "__main__":
    main()

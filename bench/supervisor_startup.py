"""One pod's start with `queueworker worker --processes N`: from spawning the supervisor to every
worker registered, and the pod's memory once they idle.

    .venv/bin/python -m bench.supervisor_startup [--processes 2,4] [--runs 10]

What a pod with several worker processes adds before all of them claim: each run spawns the
command (`System.worker_cmd`, as bench.startup does), takes the wall clock (`time.time()`), and
reads the last `started_at` of the `workers` rows (the database's clock, the same machine's) once
there are N. Then, after a second of idle, the memory of the supervisor and its workers: the sum of
their RSS (a page shared by several processes counted in each) and of their PSS (each shared page
divided among the processes sharing it: what the pod costs the node). One run first, not counted,
as in bench.startup.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time

import psutil
import psycopg

from bench.startup import POLL_SECONDS, WAIT_SECONDS, _stop, _summary, _worker_environment
from bench.systems import REPO, QueueWorker

CONCURRENCY = 100
IDLE_SECONDS = 1.0
REGISTERED = "SELECT count(*), extract(epoch FROM max(started_at))::float8 FROM queueworker.workers"


def supervisor_startup(dsn: str, processes: int, runs: int) -> dict:
    """Milliseconds from spawn to every worker registered, and the pod's RSS and PSS sums (MB), over
    `runs` runs after one not counted; `dsn` is a database with queueworker installed."""
    if runs < 1 or processes < 2:
        raise ValueError(f"runs must be at least 1 and processes at least 2, not {runs} and {processes}")
    measured = [_one_run(dsn, processes) for _ in range(runs + 1)][1:]
    registered, rss, pss = (list(values) for values in zip(*measured))
    return {"processes": processes, "runs": runs, **_summary("registered_ms", registered),
            **_summary("rss_mb", rss), **_summary("pss_mb", pss)}


def _one_run(dsn: str, processes: int) -> tuple[float, float, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE queueworker.workers")
    with tempfile.TemporaryFile("w+") as log, psycopg.connect(dsn, autocommit=True) as conn:
        spawned = time.time()
        proc = subprocess.Popen(QueueWorker(processes).worker_cmd(dsn, CONCURRENCY), stdout=log, stderr=log,
                                cwd=REPO, env=_worker_environment(), start_new_session=True)
        try:
            deadline = time.monotonic() + WAIT_SECONDS
            while (row := conn.execute(REGISTERED).fetchone())[0] < processes:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"the workers did not all register (exit code {proc.returncode}): "
                                       f"{log.read()[-1500:]}")
                time.sleep(POLL_SECONDS)
            time.sleep(IDLE_SECONDS)
            pod = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            memory = [process.memory_full_info() for process in pod]
            return ((row[1] - spawned) * 1000, sum(m.rss for m in memory) / 2**20,
                    sum(m.pss for m in memory) / 2**20)
        finally:
            _stop(proc)


def main() -> None:
    from queueworker.dev.localpg import LocalPostgres

    parser = argparse.ArgumentParser(prog="python -m bench.supervisor_startup", description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="2,4", help="comma-separated numbers of worker processes")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    try:
        counts = [int(count) for count in args.processes.split(",")]
    except ValueError:
        parser.error("--processes takes comma-separated whole numbers")
    if args.runs < 1 or min(counts) < 2:
        parser.error("--runs must be at least 1, every --processes at least 2")
    server = LocalPostgres(durable=True)
    admin = server.start()
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute('CREATE DATABASE "supervisor_startup"')
        dsn = admin.rsplit("/", 1)[0] + "/supervisor_startup"
        QueueWorker().install(dsn)
        for count in counts:
            result = supervisor_startup(dsn, count, args.runs)
            print(f"--processes {count}: {args.runs} runs, start → all registered "
                  f"{result['registered_ms_p50']:.0f} ms ({result['registered_ms_min']:.0f}–"
                  f"{result['registered_ms_max']:.0f}); pod RSS "
                  f"{result['rss_mb_p50']:.1f} MB, PSS {result['pss_mb_p50']:.1f} MB "
                  f"({result['pss_mb_min']:.1f}–{result['pss_mb_max']:.1f})")
    finally:
        server.destroy()


if __name__ == "__main__":
    main()

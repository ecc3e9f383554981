"""Worker start-up: from spawning a worker process to its first claim of a task already waiting.

    .venv/bin/python -m bench.startup [--runs 10] [--systems queueworker,pgqueuer]

What a queue scaled from zero adds before its first task runs, beyond the pod's own start. Each
run empties the queue, enqueues one no-op task, takes the wall clock (`time.time()`) and spawns the
system's worker entry point (its `System.worker_cmd`, as every other scenario runs it). The claim
and finish moments come from the database's clock (queueworker: the task's `started_at`, which
CLAIM stamps, and `finished_at`; PGQueuer: its `pgqueuer_log` rows `picked` and `successful`),
the same machine clock as the spawn's. One run first, not counted, warms the page cache and writes
the bytecode caches (PYTHONDONTWRITEBYTECODE is dropped for the worker), as an image has them: pip
compiles a wheel's modules when it installs it.

queueworker's worker runs as in every scenario: installed from its wheel with its runtime
dependencies alone, as its image installs it (bench/systems.py, `installed_python`), not from the
development checkout, whose editable install's import finder no user runs. The peers are installed
from their wheels too.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time

import psycopg

from bench.systems import ALL, REPO, System

CONCURRENCY = 100  # the runner's; PGQueuer needs at least twice its batch size
WAIT_SECONDS = 60.0
POLL_SECONDS = 0.02  # only how soon the runner sees it: the times themselves are the database's
# Per system: emptying its queue, and the claim and finish epochs of the one task (NULL until then).
RESET = {
    "queueworker": "TRUNCATE queueworker.tasks, queueworker.workers",
    "pgqueuer": "TRUNCATE pgqueuer, pgqueuer_log",
}
MOMENTS = {
    "queueworker": """SELECT extract(epoch FROM started_at)::float8, extract(epoch FROM finished_at)::float8
                      FROM queueworker.tasks WHERE state = 'succeeded'""",
    "pgqueuer": """SELECT extract(epoch FROM min(created) FILTER (WHERE status = 'picked'))::float8,
                          extract(epoch FROM min(created) FILTER (WHERE status = 'successful'))::float8
                   FROM pgqueuer_log""",
}
SYSTEMS = tuple(MOMENTS)


def startup_time(dsn: str, runs: int, system: System | None = None) -> dict:
    """Milliseconds from spawning `system`'s worker (queueworker by default) to its first claim,
    and to that task being finished, over `runs` runs (after one run not counted); `dsn` is a
    database with the system installed."""
    system = system or ALL["queueworker"]()
    if runs < 1:
        raise ValueError(f"runs must be at least 1, not {runs}")
    if system.name not in MOMENTS:
        raise ValueError(f"no start-up measurement for {system.name} (only {', '.join(SYSTEMS)})")
    claims, finishes = [], []
    for run in range(runs + 1):
        claimed, finished = _one_run(system, dsn)
        if run:
            claims.append(claimed)
            finishes.append(finished)
    return {"runs": runs, "claim_ms": claims, "finished_ms": finishes, **_summary("claim", claims),
            **_summary("finished", finishes)}


def _one_run(system: System, dsn: str) -> tuple[float, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RESET[system.name])
    system.preload_noop(dsn, 1)
    with tempfile.TemporaryFile("w+") as log, psycopg.connect(dsn, autocommit=True) as conn:
        spawned = time.time()
        proc = subprocess.Popen(system.worker_cmd(dsn, CONCURRENCY), stdout=log, stderr=log, cwd=REPO,
                                env=_worker_environment(), start_new_session=True)
        try:
            deadline = time.monotonic() + WAIT_SECONDS
            while True:
                row = conn.execute(MOMENTS[system.name]).fetchone()
                if row is not None and None not in row:
                    return (row[0] - spawned) * 1000, (row[1] - spawned) * 1000
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"{system.name} worker did not finish the task (exit code {proc.returncode}): "
                                       f"{log.read()[-1500:]}")
                time.sleep(POLL_SECONDS)
        finally:
            _stop(proc)


def _worker_environment() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(REPO)}


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _summary(name: str, values: list[float]) -> dict:
    return {f"{name}_p50": statistics.median(values), f"{name}_min": min(values), f"{name}_max": max(values)}


def main() -> None:
    from queueworker.dev.localpg import LocalPostgres

    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--systems", default="queueworker", help=f"comma-separated subset of: {', '.join(SYSTEMS)}")
    args = parser.parse_args()
    names = args.systems.split(",")
    if args.runs < 1 or not set(names) <= set(SYSTEMS):
        parser.error(f"--runs must be at least 1, --systems a subset of {', '.join(SYSTEMS)}")
    server = LocalPostgres(durable=True)
    admin = server.start()
    try:
        for name in names:
            system = ALL[name]()
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "startup_{name}"')
            dsn = admin.rsplit("/", 1)[0] + f"/startup_{name}"
            system.install(dsn)
            result = startup_time(dsn, args.runs, system)
            print(f"{name}: {args.runs} runs, start → first claim {result['claim_p50']:.0f} ms "
                  f"({result['claim_min']:.0f}–{result['claim_max']:.0f}), start → finished "
                  f"{result['finished_p50']:.0f} ms ({result['finished_min']:.0f}–{result['finished_max']:.0f})")
    finally:
        server.destroy()


if __name__ == "__main__":
    main()

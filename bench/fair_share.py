"""Fair share across the keys of a queue (docs/flow-control.md; queueworker only).

Two measures, on one throwaway server:

- **burn-down**: `--burn` no-op tasks drained by 2 worker processes of 50 slots, in turn from a
  queue without keys (the plain claim), from one whose tasks are spread over `--burn-keys` keys
  (the fair claim), from such a queue with a cap on its running tasks set too high to bind
  (`claim_limited_fair`, under the queue's row lock), and from one with per-key limits set too
  high to bind (`claim_keys`, under the same lock: a bucket and a cap per key), `--rounds` times
  each: tasks per second from the first start to the last finish (the database's clocks), and each
  claim's share of the plain one's (the key-limited one's of the queue-limited one's too), and the
  CPU each task cost Postgres and the workers from the workers' registration to the drain's end
  (read as bench/scenarios.py reads it for the comparisons);
- **a whale and minnows**: one key with `--big` tasks enqueued first, then `--small-keys` keys with
  `--per-small` tasks each, 4 worker processes of 25 slots started once all are in: when each
  small key's first task starts, counted from the start of the drain (p50, p99, max), and how many
  tasks started before it. Under FIFO every small key would wait for the whole big backlog;
- **caps that bind**: `--capped` no-op tasks over 10 keys drained by one worker process of 50
  slots under a cap of 10 running tasks for the queue, then under a cap of 1 per key: tasks per
  second from the first start to the last finish. The cap, not the slots, bounds what runs at once,
  so each claim takes 10 tasks and the next one waits for outcomes that make room.

    python -m bench.fair_share [--burn 20000] [--burn-keys 100] [--rounds 3]
                               [--big 1000000] [--small-keys 1000] [--per-small 10] [--capped 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import NamedTuple

import psycopg

from bench.queueworker_bench import Workers, fresh_database, wait_drained, percentile
from bench.scenarios import postgres_cpu, processes_cpu, watch_postgres
from queueworker.client import operations
from queueworker.client.producer import TaskSpec, enqueue_many
from queueworker.dev.localpg import LocalPostgres

BATCH = 10_000
# The caps of the "caps that bind" measure: each lets 10 tasks run at once (10 keys).
CAPS = (("a queue cap of 10", {"max_running": 10}), ("a cap of 1 per key", {"per_key_max_running": 1}))


def _enqueue(dsn: str, specs: list[TaskSpec]) -> None:
    with psycopg.connect(dsn) as conn:
        for first in range(0, len(specs), BATCH):
            enqueue_many(conn, specs[first:first + BATCH])
            conn.commit()


def _drain(dsn: str, processes: int, concurrency: int, queue: str) -> tuple[float, float]:
    """Drains `queue` with `processes` worker processes; the CPU seconds Postgres and the workers
    spent from their registration to the drain's end."""
    workers = Workers.start(dsn, processes, concurrency, "--queue", queue)
    try:
        workers.wait_registered(dsn)
        postgres, own = postgres_cpu(), processes_cpu(workers.procs)
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_drained(conn, interval=0.05)
        return postgres_cpu() - postgres, processes_cpu(workers.procs) - own
    finally:
        workers.stop()


class Burn(NamedTuple):
    """One burn-down: tasks per second, and CPU microseconds per task (Postgres's, the workers')."""

    rate: float
    postgres_cpu_us: float
    workers_cpu_us: float


def burn_rate(admin: str, tasks: int, keys: int, limits: str = "") -> Burn:
    """Tasks/s draining `tasks` no-op tasks over `keys` keys (0: no key, a plain queue); with
    `limits`, under limits that never bind, so that what is measured is the cost of the claim that
    enforces them: "queue", a cap of a million running tasks; "keys", per-key limits (every key
    may start a million a second and run a million at once)."""
    dsn = fresh_database(admin, "fair_burn")
    queue = "fair" if keys else "plain"
    with psycopg.connect(dsn, autocommit=True) as conn:
        if limits == "queue":
            operations.set_limits(conn, queue, max_running=1_000_000)
        elif limits == "keys":
            operations.set_limits(conn, queue, per_key_rate_per_second=1e6, per_key_burst=1_000_000,
                                  per_key_max_running=1_000_000)
    _enqueue(dsn, [TaskSpec(task="qw.noop", queue=queue, key=f"k{n % keys}" if keys else None)
                   for n in range(tasks)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE queueworker.tasks")
    postgres, workers = _drain(dsn, 2, 50, queue)
    return Burn(_drained_rate(dsn, tasks), 1e6 * postgres / tasks, 1e6 * workers / tasks)


def _drained_rate(dsn: str, tasks: int) -> float:
    """Tasks/s of a drain of `tasks` tasks, from the first start to the last finish."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        first, last, done = conn.execute("""
            SELECT min(started_at), max(finished_at), count(*) FILTER (WHERE state = 'succeeded')
            FROM queueworker.tasks""").fetchone()
    if done != tasks:
        raise RuntimeError(f"only {done} of {tasks} succeeded")
    return tasks / (last - first).total_seconds()


def capped_rate(admin: str, tasks: int, limits: dict[str, int]) -> float:
    """Tasks/s draining `tasks` no-op tasks over 10 keys with one worker of 50 slots under `limits`
    (operations.set_limits' arguments), caps that bind."""
    dsn = fresh_database(admin, "fair_capped")
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "capped", **limits)
    _enqueue(dsn, [TaskSpec(task="qw.noop", queue="capped", key=f"k{n % 10}") for n in range(tasks)])
    _drain(dsn, 1, 50, "capped")
    return _drained_rate(dsn, tasks)


def whale_and_minnows(admin: str, big: int, small_keys: int, per_small: int) -> dict[str, float]:
    dsn = fresh_database(admin, "fair_whale")
    _enqueue(dsn, [TaskSpec(task="qw.noop", queue="shared", key="whale")] * big)
    _enqueue(dsn, [TaskSpec(task="qw.noop", queue="shared", key=f"minnow-{n}")
                   for n in range(small_keys) for _ in range(per_small)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE queueworker.tasks")
    workers = Workers.start(dsn, 4, 25, "--queue", "shared")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # Until every minnow has started (the whale's backlog is not waited for).
            while conn.execute("""SELECT EXISTS (SELECT FROM queueworker.tasks_active
                                  WHERE key LIKE 'minnow-%' AND state = 'pending')""").fetchone()[0]:
                time.sleep(0.25)
    finally:
        workers.stop()
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("""
            WITH starts AS (
                SELECT t.key, e.id, e.at FROM queueworker.task_events e JOIN queueworker.tasks t ON t.id = e.task_id
                WHERE e.to_state = 'running'
            ), firsts AS (
                SELECT key, min(id) AS id, min(at) AS at FROM starts WHERE key LIKE 'minnow-%' GROUP BY key
            )
            SELECT extract(epoch FROM f.at - (SELECT min(at) FROM starts))::float8,
                   (SELECT count(*) FROM starts s WHERE s.id < f.id)
            FROM firsts f""").fetchall()
    seconds, before = [r[0] for r in rows], [r[1] for r in rows]
    return {"keys": len(rows), "p50_s": statistics.median(seconds), "p99_s": percentile(seconds, 99),
            "max_s": max(seconds), "p50_started_before": statistics.median(before),
            "p99_started_before": percentile(before, 99), "max_started_before": max(before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burn", type=int, default=20_000)
    parser.add_argument("--burn-keys", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--small-keys", type=int, default=1_000)
    parser.add_argument("--per-small", type=int, default=10)
    parser.add_argument("--capped", type=int, default=2_000)
    args = parser.parse_args()
    server = LocalPostgres(durable=True)
    admin = server.start()
    watch_postgres(server.data_dir)
    try:
        print(f"load before: {os.getloadavg()[0]:.2f}")
        if args.rounds:
            burns: dict[str, list[Burn]] = {"plain": [], "fair": [], "queue-limited": [], "key-limited": []}
            for _ in range(args.rounds):
                burns["plain"].append(burn_rate(admin, args.burn, 0))
                burns["fair"].append(burn_rate(admin, args.burn, args.burn_keys))
                burns["queue-limited"].append(burn_rate(admin, args.burn, args.burn_keys, limits="queue"))
                burns["key-limited"].append(burn_rate(admin, args.burn, args.burn_keys, limits="keys"))
            medians = {name: statistics.median(burn.rate for burn in values) for name, values in burns.items()}
            for name, values in burns.items():
                print(f"burn-down {name:<13} median {medians[name]:>7,.0f} tasks/s  "
                      f"({', '.join(f'{burn.rate:,.0f}' for burn in values)}); CPU per task: Postgres "
                      f"{statistics.median(burn.postgres_cpu_us for burn in values):.0f} µs, the workers "
                      f"{statistics.median(burn.workers_cpu_us for burn in values):.0f} µs")
            print("; ".join(f"{name} / plain: {medians[name] / medians['plain']:.0%}" for name in burns if name != "plain")
                  + f"; key-limited / queue-limited: {medians['key-limited'] / medians['queue-limited']:.0%}")
        if args.big:
            result = whale_and_minnows(admin, args.big, args.small_keys, args.per_small)
            print(f"one key with {args.big:,} tasks, {args.small_keys:,} keys with {args.per_small} each: "
                  f"first start of each small key after {result['p50_s']:.2f} s (p50), {result['p99_s']:.2f} s "
                  f"(p99), {result['max_s']:.2f} s (max) from the first start; tasks started before it: "
                  f"{result['p50_started_before']:,.0f} (p50), {result['p99_started_before']:,.0f} (p99), "
                  f"{result['max_started_before']:,.0f} (max)")
        if args.capped:
            for label, limits in CAPS:
                print(f"{args.capped:,} tasks in 10 keys under {label}, one worker of 50 slots: "
                      f"{capped_rate(admin, args.capped, limits):,.0f} tasks/s")
        print(f"load after: {os.getloadavg()[0]:.2f}")
    finally:
        server.destroy()


if __name__ == "__main__":
    main()

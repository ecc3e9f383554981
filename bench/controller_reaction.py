"""The controller's reaction time: a backlog appears -> the worker Deployment's replicas are patched.

Runs the test control plane (tests/cluster), a local Postgres and `queueworker-controller` as a
subprocess, with a QueueWorker at the default pollingIntervalSeconds (5 s). Each round starts from
zero replicas, waits a random part of the polling interval, commits 50 tasks and times until
`spec.replicas` of the Deployment changes (read every 10 ms). Two ways to enqueue:

- notify: the producer (`enqueue_many`), whose NOTIFY wakes the controller before the next poll;
- silent: a raw INSERT without NOTIFY, i.e. what polling alone achieves (a QueueWorker idle at zero
  whose database's LISTEN is up polls only every IDLE_POLL_SECONDS: up to a minute).

With --background N, N more QueueWorkers (each on a queue of its own, quiet) are created first, so the
reaction is measured in a controller that serves N + 1 of them.

    .venv/bin/python -m bench.controller_reaction [--rounds 10] [--polling 5] [--background 0]
                                                  [--modes notify,silent]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import psycopg

from bench.cluster_setup import bench_cluster, running_controller
from queueworker.client.producer import enqueue_many

NAMESPACE = "bench"
BACKLOG = 50


def enqueue(dsn: str, mode: str) -> None:
    with psycopg.connect(dsn) as conn:
        if mode == "notify":
            enqueue_many(conn, [{"task": "qw.noop", "queue": "bench"} for _ in range(BACKLOG)])
        else:
            conn.execute("INSERT INTO queueworker.tasks (queue, task, delayed) "
                         "SELECT 'bench', 'qw.noop', false FROM generate_series(1, %s)", (BACKLOG,))


def pending(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM queueworker.tasks WHERE state <> 'succeeded'").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--polling", type=int, default=5)
    parser.add_argument("--background", type=int, default=0, help="quiet QueueWorkers served beside the measured one")
    parser.add_argument("--modes", default="notify,silent", help="comma-separated: notify, silent")
    args = parser.parse_args()
    with bench_cluster(NAMESPACE) as cluster, running_controller(cluster):
        server, plane, apps = cluster.server, cluster.plane, cluster.apps
        for index in range(args.background):
            cluster.create_queueworker(f"quiet-{index:04d}", {
                "queue": f"quiet-{index:04d}", "image": "registry.invalid/bench-placeholder:1",
                "database": {"secretRef": {"name": "db"}}, "metricsPort": 0,
                "scaling": {"maxReplicas": 3, "pollingIntervalSeconds": args.polling}})
        if args.background:
            plane.wait_for(lambda: sum(1 for qw in cluster.queueworkers()
                                       if (qw.get("status") or {}).get("lastPollTime")) >= args.background,
                           timeout=120 + args.background, interval=2, message="the quiet QueueWorkers reconciled")
        cluster.create_queueworker("bench", {
            "queue": "bench", "image": "queueworker:bench", "database": {"secretRef": {"name": "db"}},
            "drainSeconds": 1, "metricsPort": 0,
            "scaling": {"maxReplicas": 5, "pollingIntervalSeconds": args.polling,
                        "scaleDownStabilizationSeconds": 0, "cooldownSeconds": 0}})

        def replicas() -> int:
            return apps.read_namespaced_deployment("bench-worker", NAMESPACE).spec.replicas

        results: dict[str, list[float]] = {mode: [] for mode in args.modes.split(",")}
        for round_ in range(args.rounds):
            for mode in results:
                plane.wait_for(lambda: pending(server.dsn) == 0 and replicas() == 0, timeout=120,
                               message="idle at zero")
                time.sleep(random.uniform(0.5, args.polling + 0.5))
                enqueue(server.dsn, mode)
                started = time.monotonic()
                while replicas() == 0:
                    time.sleep(0.01)
                results[mode].append(time.monotonic() - started)
                print(f"round {round_ + 1} {mode}: {results[mode][-1]:.2f}s", flush=True)
        for mode, samples in results.items():
            ordered = sorted(samples)
            p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
            print(f"{mode}: p50 {statistics.median(samples):.2f}s, p99 {p99:.2f}s, max {max(samples):.2f}s "
                  f"over {len(samples)} rounds (pollingIntervalSeconds={args.polling}, "
                  f"{args.background} other QueueWorkers)")


if __name__ == "__main__":
    main()

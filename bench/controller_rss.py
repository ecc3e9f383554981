"""The controller's memory (RSS) and CPU with many QueueWorkers: scenario 5's cluster row.

Runs the test control plane, a local Postgres and `queueworker-controller` as a subprocess
(bench/cluster_setup.py), then samples the controller every second for --seconds in each phase:

- idle: no QueueWorker yet;
- half, then all of --count QueueWorkers, each on its own queue, spread over --databases databases
  (one Secret each), every queue empty: the steady polling a quiet cluster costs;
- all of them while BACKLOG_QUEUES queues fill and drain every CYCLE_SECONDS, so the controller
  scales up, scales down to zero and prices pods for the scale-in, as under real load;
- a new controller process started into all of them at once, as after a restart or upgrade (the
  first ticks of every QueueWorker overlap, which leaves RSS higher than adding them in steps).

The workers' image is a placeholder the process kubelet has no entrypoint for: their pods are
reported Running without a process, so Deployments scale as in a cluster without hundreds of
worker processes on this machine, and a backlog stays until the benchmark drains it.

RSS is the resident set of the controller process and its children (it has none today); CPU is
user+system time (psutil). Ticks and scale operations come from the controller's own metrics.

    .venv/bin/python -m bench.controller_rss [--count 100] [--seconds 60] [--databases 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
import psycopg

from bench.cluster_setup import BenchCluster, bench_cluster, running_controller
from queueworker.db.migrate import migrate
from queueworker.client.producer import enqueue_many
from tests.cluster.controlplane import free_port

NAMESPACE = "bench"
PLACEHOLDER_IMAGE = "registry.invalid/bench-placeholder:1"
MAX_REPLICAS = 3
BACKLOG_QUEUES = 10
BACKLOG_TASKS = 30  # 3 replicas at the default tasksPerReplica (concurrency 10)
CYCLE_SECONDS = 15
# Sampling starts once the first ticks of QueueWorkers created together are over (they all create a
# Deployment and write a status at once). The lastPollTime refresh of an unchanged status comes every
# STATUS_REFRESH_SECONDS ±10% per object: a phase samples its share of those writes.
SETTLE_SECONDS = 70
TICKS = "queueworker_controller_tick_duration_seconds_count"
SCALES = "queueworker_controller_scale_total"


def controller_processes(pid: int) -> list[psutil.Process]:
    """The controller and its descendants (it has none today)."""
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def rss_mb(pid: int) -> float:
    return sum(p.memory_info().rss for p in controller_processes(pid)) / 2**20


def cpu_seconds(pid: int) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in controller_processes(pid)))


def answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except OSError:
        return False


class ControllerMetrics:
    """Sums over the controller's Prometheus series (all QueueWorkers together)."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}/metrics"

    def total(self, name: str) -> float:
        text = urllib.request.urlopen(self.url, timeout=5).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and line[len(name)] in " {")


@dataclass
class PhaseResult:
    phase: str
    rss: list[float]  # MB, one sample a second
    cpu_per_minute: float
    ticks_per_minute: float
    scales: int

    @property
    def drift(self) -> float:
        """Median of the last quarter of samples minus that of the first: growth within the phase."""
        quarter = max(1, len(self.rss) // 4)
        return statistics.median(self.rss[-quarter:]) - statistics.median(self.rss[:quarter])


def measure(phase: str, pid: int, metrics: ControllerMetrics, seconds: float,
            each_second: Callable[[float], None] = lambda elapsed: None) -> PhaseResult:
    ticks, scales = metrics.total(TICKS), metrics.total(SCALES)
    cpu, started = cpu_seconds(pid), time.monotonic()
    rss = []
    while (elapsed := time.monotonic() - started) < seconds:
        each_second(elapsed)
        rss.append(rss_mb(pid))
        time.sleep(max(0.0, len(rss) - (time.monotonic() - started)))
    minutes = (time.monotonic() - started) / 60
    result = PhaseResult(
        phase, rss, (cpu_seconds(pid) - cpu) / minutes,
        (metrics.total(TICKS) - ticks) / minutes, int(metrics.total(SCALES) - scales))
    print(f"{phase}: RSS median {statistics.median(rss):.1f} MB, max {max(rss):.1f} MB, "
          f"drift {result.drift:+.1f} MB; CPU {result.cpu_per_minute:.2f} s/min; "
          f"{result.ticks_per_minute:.0f} ticks/min; {result.scales} scales", flush=True)
    return result


def databases(cluster: BenchCluster, count: int) -> dict[str, str]:
    """`count` migrated databases on the benchmark's server, as {Secret name: URL}; the first is `db`."""
    urls = {"db": cluster.server.dsn}
    for index in range(1, count):
        with psycopg.connect(cluster.server.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE bench{index}")
        url = cluster.server.dsn.rsplit("/", 1)[0] + f"/bench{index}"
        migrate(url)
        cluster.create_secret(f"db-{index}", url)
        urls[f"db-{index}"] = url
    return urls


def queueworker_spec(queue: str, secret: str, polling: int) -> dict:
    return {"queue": queue, "image": PLACEHOLDER_IMAGE, "database": {"secretRef": {"name": secret}},
            "metricsPort": 0,
            "scaling": {"maxReplicas": MAX_REPLICAS, "pollingIntervalSeconds": polling,
                        "scaleDownStabilizationSeconds": 0, "cooldownSeconds": 0}}


def wait_reconciled(cluster: BenchCluster, count: int) -> None:
    """Until every QueueWorker has its Deployment and a status from the controller."""
    def reconciled() -> bool:
        reported = [qw for qw in cluster.queueworkers() if (qw.get("status") or {}).get("lastPollTime")]
        deployments = cluster.apps.list_namespaced_deployment(cluster.namespace).items
        return len(reported) == count and len(deployments) == count
    cluster.plane.wait_for(reconciled, timeout=120 + count, interval=1, message=f"{count} QueueWorkers reconciled")


class Backlogs:
    """Fills BACKLOG_QUEUES queues (with the producer, whose NOTIFY wakes the controller) and drains
    them again (a DELETE, as if workers had finished), switching every CYCLE_SECONDS."""

    def __init__(self, dsns_by_queue: dict[str, str]):
        self.dsns_by_queue = dsns_by_queue
        self.filled = False

    def cycle(self, elapsed: float) -> None:
        self.set(filled=int(elapsed // CYCLE_SECONDS) % 2 == 0)

    def set(self, filled: bool) -> None:
        if filled == self.filled:
            return
        for queue, dsn in self.dsns_by_queue.items():
            with psycopg.connect(dsn) as conn:
                if filled:
                    enqueue_many(conn, [{"task": "qw.noop", "queue": queue} for _ in range(BACKLOG_TASKS)])
                else:
                    conn.execute("DELETE FROM queueworker.tasks WHERE queue = %s", (queue,))
        self.filled = filled


@contextmanager
def controller_under_test(cluster: BenchCluster) -> Iterator[tuple[int, ControllerMetrics]]:
    """A fresh controller process (pid and metrics), once kopf answers on its liveness endpoint."""
    metrics_port, liveness = free_port(), f"http://127.0.0.1:{free_port()}/healthz"
    with running_controller(cluster, "--metrics-port", str(metrics_port), "--liveness", liveness) as controller:
        cluster.plane.wait_for(lambda: answers(liveness), timeout=60, message="the controller's liveness endpoint")
        yield controller.pid, ControllerMetrics(metrics_port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100, help="QueueWorkers at the end (half of them first)")
    parser.add_argument("--seconds", type=float, default=60, help="sampling time of each phase")
    parser.add_argument("--databases", type=int, default=1, help="databases (Secrets) the QueueWorkers spread over")
    parser.add_argument("--polling", type=int, default=5, help="pollingIntervalSeconds of every QueueWorker")
    parser.add_argument("--settle", type=float, default=SETTLE_SECONDS,
                        help="seconds between a step and its sampling (the cluster's own controllers take a while "
                             "to settle a thousand new Deployments)")
    args = parser.parse_args()
    with bench_cluster(NAMESPACE) as cluster:
        urls = databases(cluster, args.databases)
        secrets = list(urls)
        queues: dict[str, str] = {}  # queue -> Secret of its database
        with controller_under_test(cluster) as (pid, metrics):
            time.sleep(SETTLE_SECONDS)
            by_count = {0: measure("idle, no QueueWorkers", pid, metrics, args.seconds)}
            for step in sorted({args.count // 2, args.count} - {0}):
                for index in range(len(queues), step):
                    queue = f"q{index:03d}"
                    queues[queue] = secrets[index % len(secrets)]
                    cluster.create_queueworker(f"qw-{index:03d}", queueworker_spec(queue, queues[queue], args.polling))
                wait_reconciled(cluster, step)
                time.sleep(args.settle)
                by_count[step] = measure(f"{step} QueueWorkers, queues empty", pid, metrics, args.seconds)
            backlogs = Backlogs({queue: urls[secret] for queue, secret in list(queues.items())[:BACKLOG_QUEUES]})
            loaded = measure(f"{len(queues)} QueueWorkers, {len(backlogs.dsns_by_queue)} queues filling and "
                             f"draining every {CYCLE_SECONDS} s", pid, metrics, args.seconds, backlogs.cycle)
            backlogs.set(filled=False)
        # A restart meets every QueueWorker at once, which is what a controller usually starts into.
        with controller_under_test(cluster) as (pid, metrics):
            cluster.plane.wait_for(lambda: metrics.total(TICKS) >= len(queues), timeout=120,
                                   message="a tick of every QueueWorker")
            time.sleep(args.settle)
            restarted = measure(f"restarted with {len(queues)} QueueWorkers present, queues empty", pid, metrics,
                                args.seconds)
    print(f"\ncontroller, pollingIntervalSeconds={args.polling}, {args.databases} database(s), "
          f"{args.seconds:.0f} s per phase")
    print("| phase | RSS p50 MB | RSS max MB | drift MB | CPU s/min | ticks/min | scales |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in (*by_count.values(), loaded, restarted):
        print(f"| {r.phase} | {statistics.median(r.rss):.1f} | {max(r.rss):.1f} | {r.drift:+.1f} "
              f"| {r.cpu_per_minute:.2f} | {r.ticks_per_minute:.0f} | {r.scales} |")
    counts = list(by_count)
    for fewer, more in zip(counts, counts[1:]):
        growth_kb = (statistics.median(by_count[more].rss) - statistics.median(by_count[fewer].rss)) * 1024
        print(f"RSS per QueueWorker from {fewer} to {more}: {growth_kb / (more - fewer):.0f} kB")


if __name__ == "__main__":
    main()

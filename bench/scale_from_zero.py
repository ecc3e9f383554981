"""Scale from zero on a real node: tasks committed -> replicas patched -> pod running -> first task claimed.

Runs the test cluster with a real node (tests/cluster/node.py: kubelet, containerd, CNI; root only),
the worker image built by the image tier (tests/containers) and imported into the node, a local
Postgres that the pods reach on the node's IP, and `queueworker-controller` as a subprocess. The
QueueWorker keeps the CRD's defaults for everything that acts on the way up (pollingIntervalSeconds
5, activationTasks 0, concurrency 10, metricsPort 9100, no probes, the image's IfNotPresent pull
policy); only scaleDownStabilizationSeconds and cooldownSeconds (300 s each by default), which act
on the way down alone, are 0 so that a round does not wait five minutes for the scale to zero.

Each round waits until the Deployment is at zero with no pod left, then a random 1-3 s, commits
`--backlog` `qw.noop` tasks with the producer (`enqueue_many`, whose NOTIFY wakes the controller)
and times each step on this machine's one clock (the API server, Postgres and the containers share it):

- replicas patched: a watch on the Deployment sees spec.replicas > 0 (its arrival time);
- pod created, pod bound: a watch on the pods sees the pod, then its spec.nodeName;
- sandbox started, container started: the start times (10 ms ticks) of the pod's pause process
  and of its worker container's first process (tini), read from /proc by the pod's cgroup;
- worker registered: its queueworker.workers row's started_at (Postgres' now());
- first task claimed: the earliest `running` row of the round's tasks in queueworker.task_events.

What the kubelet reports (pod phase Running, Ready, in the API, seen by the watch) comes after its
PLEG relist notices the container (every 1 s by default), so it is shown beside the steps rather
than used for them. The first round starts the image's first container on the node (its snapshot
is prepared then): it is printed, not counted.

    python -m bench.scale_from_zero [--rounds 10] [--backlog 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from kubernetes import client, watch

from bench.cluster_setup import BenchCluster, bench_cluster, running_controller
from queueworker.client.producer import enqueue_many
from tests.containers.images import ensure_images

NAMESPACE = "bench"
NAME = "bench"
DEPLOYMENT = f"{NAME}-worker"
WATCH_SECONDS = 300
IDLE_TIMEOUT = 120
CLAIM_TIMEOUT = 120

# (milestone, what acts between the one before and this one), in the order they happen.
STEPS = (
    ("committed", ""),
    ("patched", "controller: NOTIFY -> tick -> replicas patched"),
    ("created", "kube-controller-manager: Deployment -> ReplicaSet -> pod"),
    ("bound", "kube-scheduler: pod bound to the node"),
    ("sandbox", "kubelet + containerd: pod sandbox (cgroups, network namespace, CNI, pause)"),
    ("container", "kubelet + containerd: worker container created and started"),
    ("registered", "worker start-up: Python, imports, connect, worker row"),
    ("claimed", "worker: first claim"),
)
# The kubelet's own report, read by the watch: not a step, shown against the commit.
REPORTED = (("reported_running", "API shows the pod Running"), ("reported_ready", "API shows the pod Ready"))


@dataclass
class PodSeen:
    uid: str
    times: dict[str, float] = field(default_factory=dict)


class Observed:
    """What the watch threads saw in the current round: the first arrival (epoch seconds) of each
    milestone, for the Deployment and for each pod by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.patched: float | None = None
        self.pods: dict[str, PodSeen] = {}

    def reset(self) -> None:
        with self._lock:
            self.patched, self.pods = None, {}

    def deployment(self, deployment: dict[str, Any]) -> None:
        if deployment["spec"].get("replicas"):
            with self._lock:
                self.patched = self.patched or time.time()

    def pod(self, pod: dict[str, Any]) -> None:
        now, status = time.time(), pod.get("status") or {}
        reached = {"created": True, "bound": bool(pod["spec"].get("nodeName")),
                   "reported_running": status.get("phase") == "Running" and any(
                       "running" in (c.get("state") or {}) for c in status.get("containerStatuses") or []),
                   "reported_ready": any(c["type"] == "Ready" and c["status"] == "True"
                                         for c in status.get("conditions") or [])}
        with self._lock:
            seen = self.pods.setdefault(pod["metadata"]["name"], PodSeen(pod["metadata"]["uid"]))
            for milestone, now_true in reached.items():
                if now_true:
                    seen.times.setdefault(milestone, now)


def _watch_forever(list_call: Callable[..., Any], handle: Callable[[Any], None], stopping: threading.Event) -> None:
    """Streams `list_call`'s objects in NAMESPACE to `handle` until `stopping`, reconnecting as needed.
    The objects stay plain dicts (return_type=object): deserializing them into the client's models
    takes tens of milliseconds on a loaded machine, which would delay the arrival times taken."""
    while not stopping.is_set():
        try:
            for event in watch.Watch(return_type=object).stream(list_call, NAMESPACE, timeout_seconds=WATCH_SECONDS):
                if stopping.is_set():
                    return
                if event["type"] in ("ADDED", "MODIFIED") and not event["object"]["metadata"].get("deletionTimestamp"):
                    handle(event["object"])
        except Exception:  # noqa: BLE001 - a broken stream is reopened, until `stopping`
            time.sleep(0.5)


@contextmanager
def watching(cluster: BenchCluster) -> Iterator[Observed]:
    """Observed, fed by watches on the namespace's Deployments and pods (a client each)."""
    observed, stopping = Observed(), threading.Event()
    apps = client.AppsV1Api(cluster.plane.api_client())
    core = client.CoreV1Api(cluster.plane.api_client())
    threads = [threading.Thread(target=_watch_forever, daemon=True, args=args) for args in (
        (apps.list_namespaced_deployment, observed.deployment, stopping),
        (core.list_namespaced_pod, observed.pod, stopping))]
    for thread in threads:
        thread.start()
    try:
        yield observed
    finally:
        stopping.set()


class PodProcesses(NamedTuple):
    sandbox: float | None  # the pause process's start (epoch seconds)
    container: float | None  # the worker container's first process (tini)


def pod_processes(uid: str) -> PodProcesses:
    """Start times of the pod's processes, found by their cgroup (the cgroupfs driver names it
    `.../pod<uid>/<container>`). /proc/PID/stat counts them in clock ticks since boot."""
    marker, ticks = f"/pod{uid}/", os.sysconf("SC_CLK_TCK")
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    started: dict[str, list[float]] = {"pause": [], "other": []}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if marker not in Path(f"/proc/{entry}/cgroup").read_text():
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        start = booted + int(stat.rsplit(")", 1)[1].split()[19]) / ticks
        started["pause" if comm == "pause" else "other"].append(start)
    return PodProcesses(min(started["pause"], default=None), min(started["other"], default=None))


class FirstClaim(NamedTuple):
    claimed: float
    registered: float | None
    pod_name: str | None


def first_claim(dsn: str, ids: list[int]) -> FirstClaim | None:
    """The earliest claim of the round's tasks, with the claiming worker's registration and pod."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM e.at)::float8, extract(epoch FROM w.started_at)::float8, w.pod_name "
            "FROM queueworker.task_events e LEFT JOIN queueworker.workers w ON w.id = e.worker "
            "WHERE e.task_id = ANY(%s) AND e.to_state = 'running' ORDER BY e.at LIMIT 1", (ids,)).fetchone()
    return FirstClaim(*row) if row else None


def idle_at_zero(cluster: BenchCluster) -> bool:
    with psycopg.connect(cluster.server.dsn) as conn:
        unfinished = conn.execute("SELECT count(*) FROM queueworker.tasks WHERE state <> 'succeeded'").fetchone()[0]
    return (unfinished == 0 and cluster.apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE).spec.replicas == 0
            and not cluster.core.list_namespaced_pod(NAMESPACE).items)


def one_round(cluster: BenchCluster, observed: Observed, backlog: int) -> dict[str, float | None]:
    """Milestone -> epoch seconds for one scale from zero (None where it was not seen)."""
    cluster.plane.wait_for(lambda: idle_at_zero(cluster), timeout=IDLE_TIMEOUT, interval=0.5,
                           message="scaled to zero with no pod left")
    time.sleep(random.uniform(1.0, 3.0))
    observed.reset()
    with psycopg.connect(cluster.server.dsn) as conn:
        ids = enqueue_many(conn, [{"task": "qw.noop", "queue": NAME} for _ in range(backlog)])
        conn.commit()
    committed = time.time()
    claim = cluster.plane.wait_for(lambda: first_claim(cluster.server.dsn, ids), timeout=CLAIM_TIMEOUT,
                                   interval=0.02, message="the first task claimed")
    pod = observed.pods.get(claim.pod_name or "")
    processes = pod_processes(pod.uid) if pod else PodProcesses(None, None)
    if pod:  # the kubelet's report may come after the claim
        cluster.plane.wait_for(lambda: "reported_ready" in pod.times, timeout=30, message="the pod Ready")
    times = pod.times if pod else {}
    return {"committed": committed, "patched": observed.patched, "created": times.get("created"),
            "bound": times.get("bound"), "sandbox": processes.sandbox, "container": processes.container,
            "registered": claim.registered, "claimed": claim.claimed,
            **{milestone: times.get(milestone) for milestone, _ in REPORTED}}


def _stats(samples: list[float]) -> str:
    if not samples:
        return "| – | – | – |"
    return f"| {statistics.median(samples):.2f} s | {min(samples):.2f} s | {max(samples):.2f} s |"


def report(rounds: list[dict[str, float | None]]) -> str:
    """The markdown table: each step's p50/min/max, then the total and the kubelet's reports."""
    lines = ["| step | what acts | p50 | min | max |", "|---|---|---:|---:|---:|"]
    for (before, _), (milestone, acts) in zip(STEPS, STEPS[1:]):
        samples = [r[milestone] - r[before] for r in rounds if r[milestone] is not None and r[before] is not None]
        lines.append(f"| {before} → {milestone} | {acts} {_stats(samples)}")
    total = [r["claimed"] - r["committed"] for r in rounds]
    lines.append(f"| **committed → claimed (total)** | end to end {_stats(total)}")
    for milestone, what in REPORTED:
        samples = [r[milestone] - r["committed"] for r in rounds if r[milestone] is not None]
        lines.append(f"| committed → {milestone} | {what} (kubelet's report, not a step) {_stats(samples)}")
    return "\n".join(lines)


def _describe(round_: dict[str, float | None]) -> str:
    marks = [f"{m} +{round_[m] - round_['committed']:.2f}" for m, _ in STEPS[1:] if round_[m] is not None]
    return ", ".join(marks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="counted rounds (after one uncounted first round)")
    parser.add_argument("--backlog", type=int, default=5, help="tasks committed per round")
    args = parser.parse_args()
    started = time.monotonic()
    image = ensure_images().worker
    print(f"worker image {image} ready in {time.monotonic() - started:.1f}s", flush=True)
    with bench_cluster(NAMESPACE, node=True) as cluster, running_controller(cluster), watching(cluster) as observed:
        print(f"cluster with a real node ready at {time.monotonic() - started:.1f}s", flush=True)
        loading = time.monotonic()
        cluster.plane.load_image(image)
        print(f"image imported into the node in {time.monotonic() - loading:.1f}s", flush=True)
        cluster.create_queueworker(NAME, {
            "queue": NAME, "image": image, "database": {"secretRef": {"name": "db"}},
            "scaling": {"scaleDownStabilizationSeconds": 0, "cooldownSeconds": 0},
            "template": {"spec": {"containers": [{"name": "worker", "env": [  # it runs qw.noop
                {"name": "QUEUEWORKER_BUILTIN_TASKS", "value": "true"}]}]}}})
        cluster.plane.wait_for(lambda: cluster.apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE), timeout=60,
                               message="the worker Deployment")
        rounds = []
        for index in range(args.rounds + 1):
            round_ = one_round(cluster, observed, args.backlog)
            total = round_["claimed"] - round_["committed"]
            label = "first (not counted)" if index == 0 else f"round {index}"
            print(f"{label}: {total:.2f}s ({_describe(round_)})", flush=True)
            if index:
                rounds.append(round_)
    print(f"\n{report(rounds)}\n\n{len(rounds)} rounds, backlog {args.backlog} tasks, pollingIntervalSeconds 5 "
          f"(default); {time.monotonic() - started:.0f}s in all")


if __name__ == "__main__":
    main()

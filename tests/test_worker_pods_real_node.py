"""Worker pods as real containers: the controller (as production starts it) runs QueueWorkers on the
real node, whose pods come from the worker image built by the image tier.

What the process kubelet cannot show: the image's entrypoint (tini, then `queueworker worker`) under
a real runtime, the Pod Security "restricted" profile actually enforced inside the container (non-root
uid, no capabilities, no privilege escalation, read-only root with a writable /tmp), resource limits
in the container's cgroup, and a deleted pod's SIGTERM travelling kubelet → containerd → tini → the
worker, which drains and hands its lease back within the grace period.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from kubernetes import client, watch
from kubernetes.stream import stream

from queueworker.db.migrate import migrate
from tests.cluster.fixtures import install_crd
from tests.controller_cluster import (BUILTIN_TASKS, DB_SECRET, Cluster, enqueue_sleeps, lease_holders, running_controller,
                                           task_report, write_controller_kubeconfig)

pytestmark = [pytest.mark.cluster, pytest.mark.image, pytest.mark.integration]

MEMORY_LIMIT = 256 * 1024 * 1024


@pytest.fixture(scope="session")
def node_controller_kubeconfig(real_node, tmp_path_factory) -> Path:
    install_crd(real_node)
    return write_controller_kubeconfig(real_node, tmp_path_factory.mktemp("node-controller") / "kubeconfig")


@pytest.fixture(scope="session")
def worker_image(real_node, images) -> str:
    """The worker image, imported into the node's containerd (nothing can be pulled here)."""
    real_node.load_image(images.worker)
    return images.worker


@pytest.fixture
def node_database(node_postgres) -> Iterator[tuple[str, str]]:
    """A fresh migrated database on the Postgres the node's pods reach: (host URL, pods' URL)."""
    name = f"qw_node_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(node_postgres.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    host, pods = (psycopg.conninfo.make_conninfo(url, dbname=name) for url in (node_postgres.dsn,
                                                                              node_postgres.pod_dsn))
    migrate(host)
    yield host, pods
    with psycopg.connect(node_postgres.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def node_cluster(real_node, real_node_namespace, node_controller_kubeconfig, node_database,
                 tmp_path) -> Iterator[Cluster]:
    _, pod_url = node_database
    with running_controller(real_node, real_node_namespace, node_controller_kubeconfig, pod_url,
                            tmp_path) as helper:
        yield helper


def node_worker_spec(image: str, **overrides) -> dict:
    """A QueueWorker for the node: the real worker image, short windows, fast leases."""
    scaling = {"pollingIntervalSeconds": 1, "scaleDownStabilizationSeconds": 2, "cooldownSeconds": 2,
               **overrides.pop("scaling", {})}
    return {"queue": "jobs", "image": image, "database": {"secretRef": {"name": DB_SECRET}},
            "concurrency": 2, "leaseSeconds": 6, "drainSeconds": 3, "metricsPort": 0, "scaling": scaling,
            "template": BUILTIN_TASKS, **overrides}


def exec_in(cluster: Cluster, pod: str, *command: str) -> tuple[int, str]:
    """Runs `command` in the pod's worker container; (exit status, stdout + stderr)."""
    ws = stream(cluster.core.connect_get_namespaced_pod_exec, pod, cluster.namespace, container="worker",
                command=list(command), stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False)
    ws.run_forever(timeout=30)
    return ws.returncode, (ws.read_stdout() or "") + (ws.read_stderr() or "")


def describe(cluster: Cluster) -> str:
    """What the namespace looks like: QueueWorker status, pods and recent events (for failures)."""
    lines = [f"queueworker {q['metadata']['name']}: {q.get('status', {}).get('reason')} "
             f"{q.get('status', {}).get('message')}" for q in cluster.custom.list_namespaced_custom_object(
                 "queueworker.dev", "v1alpha1", cluster.namespace, "queueworkers")["items"]]
    for pod in cluster.core.list_namespaced_pod(cluster.namespace).items:
        states = [(c.name, c.state.to_dict()) for c in pod.status.container_statuses or []]
        lines.append(f"pod {pod.metadata.name}: {pod.status.phase} {states}")
    lines += [f"event {e.reason}: {e.message}" for e in cluster.events()[-15:]]
    return "\n".join(lines)


def running_pods(cluster: Cluster, name: str) -> list[client.V1Pod]:
    return [p for p in cluster.pods(name) if p.status.phase == "Running" and all(
        s.ready for s in p.status.container_statuses or [])]


def test_worker_pods_run_restricted_from_the_worker_image_and_finish_every_task_once(
        node_cluster: Cluster, node_database, worker_image):
    host_url, _ = node_database
    node_cluster.enforce_restricted()
    node_cluster.apply("restricted", node_worker_spec(worker_image, scaling={
        "minReplicas": 0, "maxReplicas": 2, "tasksPerReplica": 2}, template={"spec": {"containers": [{
            "name": "worker", "resources": {"limits": {"memory": "256Mi"}, "requests": {"memory": "64Mi"}},
            "env": BUILTIN_TASKS["spec"]["containers"][0]["env"]}]}}))
    ids = enqueue_sleeps(host_url, *[1.0] * 8)
    pods = node_cluster.wait_for(lambda: len(running_pods(node_cluster, "restricted")) == 2 and
                                 running_pods(node_cluster, "restricted"), timeout=120,
                                 message=lambda: "two worker pods running on the node\n" + describe(node_cluster))

    pod = pods[0].metadata.name
    status, init = exec_in(node_cluster, pod, "cat", "/proc/1/status")
    assert status == 0, init
    fields = dict(line.split(":\t", 1) for line in init.splitlines() if ":\t" in line)
    assert fields["Name"].strip() == "tini", "the image's init is PID 1"
    assert fields["Uid"].split()[:2] == ["10001", "10001"] and fields["NoNewPrivs"].strip() == "1"
    assert int(fields["CapEff"], 16) == 0 and fields["Seccomp"].strip() == "2"
    status, output = exec_in(node_cluster, pod, "sh", "-c", "touch /probe")
    assert status != 0 and "Read-only file system" in output
    assert exec_in(node_cluster, pod, "sh", "-c", "touch /tmp/probe && rm /tmp/probe")[0] == 0
    status, limit = exec_in(node_cluster, pod, "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert (status, int(limit)) == (0, MEMORY_LIMIT)

    node_cluster.wait_for(lambda: task_report(host_url)["states"] == {"succeeded": len(ids)}, timeout=120,
                          message="every task succeeded")
    assert task_report(host_url)["succeeded_more_than_once"] == 0
    node_cluster.wait_for(lambda: node_cluster.replicas("restricted") == 0 and not node_cluster.pods("restricted"),
                          timeout=120, message="scaled back to zero, pods gone")


def test_a_deleted_busy_pod_drains_through_the_runtime_and_hands_its_task_back(
        node_cluster: Cluster, node_database, worker_image):
    """SIGTERM goes kubelet → containerd → tini → worker: the worker drains (2 s, too short for its
    20 s task), releases the lease without consuming the attempt and exits 0, all within the pod's
    grace period (drain + 10 s); another worker finishes the task."""
    host_url, _ = node_database
    node_cluster.apply("drain", node_worker_spec(worker_image, concurrency=1, drainSeconds=2,
                                                 scaling={"minReplicas": 2, "maxReplicas": 2}))
    (task_a, task_b) = enqueue_sleeps(host_url, 20.0, 20.0)
    holders = node_cluster.wait_for(lambda: len(lease_holders(host_url)) == 2 and lease_holders(host_url),
                                    timeout=120, message="both workers hold one task")
    victim = holders[task_a]
    with psycopg.connect(host_url) as conn:
        victim_worker = conn.execute("SELECT lease_owner FROM queueworker.tasks WHERE id = %s", (task_a,)).fetchone()[0]

    exit_codes: list[int] = []
    watcher = threading.Thread(target=_record_exit_code, args=(node_cluster, victim, exit_codes), daemon=True)
    watcher.start()
    deleted_at = time.monotonic()
    node_cluster.core.delete_namespaced_pod(victim, node_cluster.namespace)
    node_cluster.wait_for(lambda: victim not in {p.metadata.name for p in node_cluster.core.list_namespaced_pod(
        node_cluster.namespace).items}, timeout=60, message="the deleted pod to go")
    gone_after = time.monotonic() - deleted_at
    watcher.join(10)

    assert exit_codes and exit_codes[-1] == 0, f"the worker container's exit code: {exit_codes}"
    assert gone_after < 12 + 5, f"the pod took {gone_after:.1f}s to go (grace period 12 s)"
    with psycopg.connect(host_url) as conn:
        released = conn.execute("SELECT count(*) FROM queueworker.task_events WHERE task_id = %s AND "
                                "from_state = 'running' AND to_state = 'pending' AND worker = %s",
                                (task_a, victim_worker)).fetchone()[0]
    assert released == 1, "the deleted pod's worker handed its lease back"
    node_cluster.wait_for(lambda: task_report(host_url)["states"] == {"succeeded": 2}, timeout=120,
                          message="both tasks finished")
    with psycopg.connect(host_url) as conn:
        attempts, finisher = conn.execute("SELECT attempts, lease_owner FROM queueworker.tasks WHERE id = %s",
                                          (task_a,)).fetchone()
    assert attempts == 1, "handing the lease back did not consume an attempt"
    assert finisher != victim_worker
    assert task_report(host_url)["succeeded_more_than_once"] == 0 and task_b


def _record_exit_code(cluster: Cluster, pod: str, exit_codes: list[int]) -> None:
    """Watches the pod until it is deleted, keeping every terminated exit code its container reports."""
    stream_ = watch.Watch().stream(cluster.core.list_namespaced_pod, cluster.namespace,
                                   field_selector=f"metadata.name={pod}", timeout_seconds=60)
    for event in stream_:
        for container in event["object"].status.container_statuses or []:
            terminated = container.state.terminated
            if terminated is not None:
                exit_codes.append(terminated.exit_code)
        if event["type"] == "DELETED":
            return

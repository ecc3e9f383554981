"""The controller's reaction time: a backlog appears -> the worker Deployment's replicas are patched.

Runs the test control plane (tests/cluster), a local Postgres and `queueworker-controller` as a
subprocess, with a QueueWorker at the default pollingIntervalSeconds (5 s). Each round starts from
zero replicas, waits a random part of the polling interval, commits 50 tasks and times until
`spec.replicas` of the Deployment changes (read every 10 ms). Two ways to enqueue:

- notify: the producer (`enqueue_many`), whose NOTIFY wakes the controller before the next poll;
- silent: a raw INSERT without NOTIFY, i.e. what polling alone achieves.

    .venv/bin/python -m bench.controller_reaction [--rounds 10] [--polling 5]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import yaml
from kubernetes import client

from queueworker.localpg import LocalPostgres
from queueworker.migrate import migrate
from queueworker.producer import enqueue_many
from queueworker_controller.spec import GROUP, PLURAL, VERSION
from tests.cluster.binaries import ensure_binaries
from tests.cluster.controlplane import ControlPlane

REPO = Path(__file__).resolve().parent.parent
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
    args = parser.parse_args()
    server = LocalPostgres()
    server.start()
    migrate(server.dsn)
    plane = ControlPlane(Path(tempfile.mkdtemp(prefix="qw-bench-plane-")))
    plane.start(ensure_binaries())
    controller = None
    try:
        api = plane.api_client()
        client.ApiextensionsV1Api(api).create_custom_resource_definition(
            yaml.safe_load((REPO / "crds" / "queueworker.dev_queueworkers.yaml").read_text()))
        core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        plane.wait_for(lambda: core.read_namespaced_service_account("default", NAMESPACE))
        core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "db"}, "stringData": {"url": server.dsn}})
        controller = subprocess.Popen(
            [str(Path(sys.executable).parent / "queueworker-controller"), "--namespace", NAMESPACE],
            env={**os.environ, "KUBECONFIG": str(plane.kubeconfig)}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd=REPO)
        plane.wait_for(lambda: custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL) is not None,
                       timeout=60)
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "QueueWorker", "metadata": {"name": "bench"},
            "spec": {"queue": "bench", "image": "queueworker:bench", "database": {"secretRef": {"name": "db"}},
                     "drainSeconds": 1, "metricsPort": 0,
                     "scaling": {"maxReplicas": 5, "pollingIntervalSeconds": args.polling,
                                 "scaleDownStabilizationSeconds": 0, "cooldownSeconds": 0}}})

        def replicas() -> int:
            return apps.read_namespaced_deployment("bench-worker", NAMESPACE).spec.replicas

        results: dict[str, list[float]] = {"notify": [], "silent": []}
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
            print(f"{mode}: p50 {statistics.median(samples):.2f}s, max {max(samples):.2f}s "
                  f"over {len(samples)} rounds (pollingIntervalSeconds={args.polling})")
    finally:
        if controller is not None:
            controller.send_signal(signal.SIGTERM)
            controller.wait(timeout=20)
        plane.stop()
        server.destroy()


if __name__ == "__main__":
    main()

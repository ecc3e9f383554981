"""What the controller reads of a scale target's pod template (queueworker_controller.workload): the
worker's drain, and the worker processes a pod runs, which its connections are counted by."""

from __future__ import annotations

import pytest
from queueworker.runtime.worker import CONNECTIONS_PER_WORKER
from queueworker_controller.spec import QueueWorkerSpec
from queueworker_controller.workload import worker_drain, worker_processes


def workload(*containers: dict) -> dict:
    return {"spec": {"template": {"spec": {"terminationGracePeriodSeconds": 40, "containers": list(containers)}}}}


@pytest.mark.parametrize(("pod_containers", "processes"), [
    ([{"args": ["worker", "--processes", "4"]}], 4),
    ([{"command": ["queueworker", "worker", "--processes=3"]}], 3),
    ([{"name": "sidecar", "args": ["--processes", "9"]}, {"args": ["worker", "--processes", "2"]}], 2),
    ([{"args": ["worker"]}], 1),  # the worker's default
    ([{"args": ["worker", "--processes", "many"]}], 1),  # not readable: one
    ([{"args": ["serve", "--processes", "8"]}], 1),  # not a queueworker worker
    ([], 1),
])
def test_worker_processes_are_read_as_the_drain_is(pod_containers, processes):
    assert worker_processes(workload(*pod_containers)) == processes


def test_the_drain_is_read_from_the_first_worker_container_that_gives_it():
    assert worker_drain(workload({"args": ["worker"]}, {"args": ["worker", "--drain-seconds=7"]})) == (40, 7)
    assert worker_drain(workload({"args": ["worker", "--drain-seconds", "nan"]})) == (None, None)
    assert worker_drain(workload({"args": ["serve"]})) == (None, None)


def test_an_owned_deployment_is_created_within_max_connections():
    base = {"queue": "q", "image": "i", "scaling": {"minReplicas": 3}}
    assert QueueWorkerSpec.from_dict({**base, "database": {"secretRef": {"name": "s"}}}).initial_replicas == 3
    assert QueueWorkerSpec.from_dict({**base, "database": {"secretRef": {"name": "s"}, "maxConnections": 2 * CONNECTIONS_PER_WORKER + 1}}
                                     ).initial_replicas == 2

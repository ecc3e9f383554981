"""Leader election against a real API server: the Lease rules with controlled clocks, then two real
controller processes, whose leader is SIGKILLed (the standby must scale within 15 s) or frozen
(it must stop rather than act once it wakes up)."""

from __future__ import annotations

import re
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from queueworker.dev.localpg import free_port
from queueworker_controller.leader import EXIT_LEADERSHIP_LOST, ElectionTiming, LeaderElector
from tests.controller_cluster import (
    DB_SECRET, SYSTEM_NAMESPACE, Cluster, enqueue_sleeps, start_controller, stop_controller, worker_spec,
)

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

TIMING = ElectionTiming(lease_seconds=8, renew_deadline_seconds=5, retry_seconds=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def controller_api(controller_kubeconfig) -> Iterator[client.ApiClient]:
    """The controller's own identity (the chart's rules), as the elector uses it."""
    api = config.new_client_from_config(config_file=str(controller_kubeconfig))
    yield api
    api.close()


def elector(api: client.ApiClient, lease: str, identity: str, clock: Clock, lost: list[str]) -> LeaderElector:
    return LeaderElector(api, SYSTEM_NAMESPACE, lease, identity, TIMING, monotonic=clock,
                         on_lost=lambda: lost.append(identity))


def test_a_lease_is_taken_renewed_and_taken_over_only_after_it_went_unrenewed_for_its_duration(controller_api):
    lease, lost = f"lease-{uuid.uuid4().hex[:8]}", []
    clock_a, clock_b = Clock(), Clock()
    a, b = elector(controller_api, lease, "a", clock_a, lost), elector(controller_api, lease, "b", clock_b, lost)
    assert a.try_acquire_or_renew() and a.leading(), "a free Lease is taken"
    assert not b.try_acquire_or_renew() and not b.leading()
    for _ in range(10):  # a renews every second: b never sees the same record for 8 s
        clock_a.now += 1
        clock_b.now += 1
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()

    clock_a.now += 5.0  # a goes silent; by its own clock it stops leading at the renew deadline
    assert not a.leading()
    a.ensure_leading()  # as before any write: a replica that no longer leads stops
    assert lost == ["a"]
    clock_b.now += 7.9
    assert not b.try_acquire_or_renew(), "unchanged for less than leaseDurationSeconds by b's clock"
    clock_b.now += 0.2
    assert b.try_acquire_or_renew() and b.leading(), "unchanged for 8 s: b takes over"

    spec = client.CoordinationV1Api(controller_api).read_namespaced_lease(lease, SYSTEM_NAMESPACE).spec
    assert (spec.holder_identity, spec.lease_transitions, spec.lease_duration_seconds) == ("b", 1, 8)
    assert not a.try_acquire_or_renew(), "a stale leader cannot renew someone else's Lease"

    b.release()
    assert not b.leading()
    assert a.try_acquire_or_renew(), "a released Lease is taken at once"
    assert lost == ["a"]


def test_of_candidates_racing_for_a_free_lease_exactly_one_leads(controller_api):
    lease, lost = f"lease-{uuid.uuid4().hex[:8]}", []
    candidates = [elector(controller_api, lease, f"c{i}", Clock(), lost) for i in range(6)]
    start = threading.Barrier(len(candidates))
    results: dict[str, bool] = {}

    def race(candidate: LeaderElector) -> None:
        start.wait()
        results[candidate.identity] = candidate.try_acquire_or_renew()

    threads = [threading.Thread(target=race, args=(c,)) for c in candidates]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [identity for identity, won in results.items() if won]
    assert len(winners) == 1, results
    holder = client.CoordinationV1Api(controller_api).read_namespaced_lease(lease, SYSTEM_NAMESPACE).spec
    assert holder.holder_identity == winners[0]


def test_a_candidate_counts_a_lease_from_the_answer_to_its_read_not_from_when_it_asked(controller_api):
    """A read that takes 3 s (a slow API server) returns a renewal the holder made at most 3 s ago;
    counted from before the request, the candidate would take over 3 s early, while the holder may
    still lead by its renew deadline (client-go notes `observedTime` once the read returned)."""
    lease, lost = f"lease-{uuid.uuid4().hex[:8]}", []
    clock_a, clock_b = Clock(), Clock()
    a, b = elector(controller_api, lease, "a", clock_a, lost), elector(controller_api, lease, "b", clock_b, lost)
    assert a.try_acquire_or_renew()
    read = b._read

    def slow_read(timeout: tuple[float, float]) -> dict | None:
        answer = read(timeout)
        clock_b.now += 3.0  # the answer arrives 3 s after b asked
        return answer

    b._read = slow_read
    assert not b.try_acquire_or_renew()
    b._read = read
    clock_b.now += 5.5  # 8.5 s since b asked, 5.5 s since it saw a's record
    assert not b.try_acquire_or_renew(), "the record was seen unchanged for 5.5 s only"
    clock_b.now += 2.6
    assert b.try_acquire_or_renew() and b.leading(), "unchanged for 8 s since b saw it: b takes over"
    assert lost == []


# --- two controller processes ------------------------------------------------------------------

class Replica:
    """One `queueworker-controller --leader-election` process."""

    def __init__(self, namespace: str, kubeconfig: Path, tmp_path: Path, name: str, lease: str):
        self.name, self.log = name, tmp_path / f"controller-{name}.log"
        self.metrics_port, self.liveness_port = free_port(), free_port()
        self.process = start_controller(
            kubeconfig, namespace, self.log, self.metrics_port, self.liveness_port,
            "--leader-election", f"--leader-election-namespace={SYSTEM_NAMESPACE}",
            f"--leader-election-name={lease}", f"--leader-election-identity={name}")

    def leading(self) -> bool:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).read().decode()
        except OSError:
            return False
        return "queueworker_controller_leader 1.0" in text

    def alive(self) -> bool:
        """Its liveness endpoint answers (a standby's too: it must not be restarted for waiting)."""
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2).status == 200
        except OSError:
            return False

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def scale_writes(self) -> list[str]:
        """The replica changes this process made (the reconciler logs each one it applies)."""
        return re.findall(r": (?:Activated|ScaledUp|ScaledDown|ScaledToZero|ClampedToBounds): .*", self.text())


@pytest.fixture
def ha(control_plane, cluster_namespace, controller_kubeconfig, dsn, tmp_path) -> Iterator[tuple[Cluster, list[Replica]]]:
    """The namespace with Secret `app-db`, and two controller replicas electing a leader."""
    lease = f"qw-{uuid.uuid4().hex[:8]}"
    with control_plane.api_client() as api:
        helper = Cluster(control_plane, cluster_namespace, api, tmp_path / "controller-one.log", 0, 0)
        helper.core.create_namespaced_secret(cluster_namespace, {
            "metadata": {"name": DB_SECRET}, "stringData": {"url": dsn}})
        started = [Replica(cluster_namespace, controller_kubeconfig, tmp_path, name, lease) for name in ("one", "two")]
        try:
            yield helper, started
            helper.delete_queueworkers()  # while a leader runs, to remove kopf's finalizers
        finally:
            for replica in started:
                stop_controller(replica.process)
                print(f"--- controller {replica.name} ---\n" + "\n".join(replica.text().splitlines()[-80:]))


def leader_and_standby(cluster: Cluster, replicas: list[Replica]) -> tuple[Replica, Replica]:
    leader = cluster.wait_for(lambda: next((r for r in replicas if r.leading()), None), timeout=30,
                              message="a leader")
    (standby,) = [r for r in replicas if r is not leader]
    cluster.wait_for(leader.alive, timeout=30, message="the leader's (kopf's) liveness endpoint")
    cluster.wait_for(standby.alive, timeout=30, message="the standby's liveness endpoint")
    assert not standby.leading()
    return leader, standby


def idle_queueworker(cluster: Cluster, name: str) -> None:
    cluster.apply(name, {**worker_spec(maxReplicas=3), "concurrency": 2})
    cluster.wait_for(lambda: cluster.queueworker(name).get("status", {}).get("reason") == "Idle", timeout=30,
                     message="the QueueWorker idle at zero")


def test_the_standby_scales_within_15_seconds_of_the_leaders_death(ha, dsn):
    cluster, replicas = ha
    leader, standby = leader_and_standby(cluster, replicas)
    idle_queueworker(cluster, "failover")
    leader.process.send_signal(signal.SIGKILL)
    died = time.monotonic()
    enqueue_sleeps(dsn, *[5.0] * 20)  # the backlog appears as the leader dies
    cluster.wait_for(lambda: cluster.replicas("failover") == 3, timeout=40, message="the standby to scale up")
    failover = time.monotonic() - died
    print(f"failover (leader SIGKILLed -> standby scaled the backlog): {failover:.1f}s")
    assert failover <= 15, failover
    assert standby.leading()
    assert re.search(rf"{standby.name} took Lease {SYSTEM_NAMESPACE}/\S+ over from {leader.name}", standby.text())
    assert leader.scale_writes() == [], "the dead leader made no scale write (it never had a reason to)"
    assert len(standby.scale_writes()) == 1, standby.scale_writes()


def test_a_frozen_leader_is_replaced_and_stops_instead_of_acting_when_it_wakes(ha, dsn):
    cluster, replicas = ha
    leader, standby = leader_and_standby(cluster, replicas)
    idle_queueworker(cluster, "frozen")
    leader.process.send_signal(signal.SIGSTOP)  # a leader cut off (a paused VM, a partition): it cannot renew
    enqueue_sleeps(dsn, *[5.0] * 20)
    cluster.wait_for(lambda: cluster.replicas("frozen") == 3, timeout=40, message="the standby to take over")
    assert standby.leading()
    before = leader.text()
    leader.process.send_signal(signal.SIGCONT)
    assert leader.process.wait(timeout=20) == EXIT_LEADERSHIP_LOST
    after = leader.text()[len(before):]
    assert "lost the lead" in after
    assert leader.scale_writes() == [], "the old leader wrote nothing, before or after it woke"
    assert standby.leading()

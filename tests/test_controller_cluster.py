"""The controller against a real API server, controller-manager, process kubelet and Postgres.

It runs as in production: the `queueworker-controller` console script in a subprocess, as a
ServiceAccount bound to a ClusterRole made of exactly the rules the chart grants
(charts/queueworker/files/controller-rules.yaml). Worker pods really run `queueworker worker`.
Windows are shortened in the test QueueWorkers so the whole file stays within a few minutes.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request

import psycopg
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from queueworker.client import operations
from queueworker.client.producer import enqueue_many
from queueworker.runtime.worker import CONNECTIONS_PER_WORKER
from queueworker_controller.deployment import OWNER_LABEL
from queueworker_controller.kube import DELETION_COST_ANNOTATION
from queueworker_controller.spec import SCALED_BY_ANNOTATION
from queueworker.scaling.resource import GROUP, PLURAL, VERSION
from tests.controller_cluster import Cluster, DB_SECRET, create_queueworker, SYSTEM_NAMESPACE, announce, cluster, enqueue_sleeps, lease_holders, task_report, worker_spec  # noqa: F401 (cluster: a fixture)

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def replicas_seen(cluster: Cluster, name: str, polls: int) -> set[int]:
    """The Deployment's replicas now and after each of the next `polls` polls."""
    seen = {cluster.replicas(name)}
    for _ in range(polls):
        cluster.wait_for_ticks(1, name)
        seen.add(cluster.replicas(name))
    return seen


# --- tests ---------------------------------------------------------------------------------------------

def test_minimal_queueworker_gets_an_owned_deployment_and_a_filled_status(cluster: Cluster):
    cluster.apply("emails", {"queue": "emails", "image": "registry.example/app-worker:1.4", "handlers": "app.tasks",
                             "database": {"secretRef": {"name": DB_SECRET, "key": "url"}},
                             "scaling": {"maxReplicas": 20}})
    deployment = cluster.wait_for(lambda: cluster.apps.read_namespaced_deployment("emails-worker", cluster.namespace),
                                  message="Deployment emails-worker")
    qw = cluster.queueworker("emails")
    (owner,) = deployment.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == \
        ("QueueWorker", "emails", qw["metadata"]["uid"], True)
    container = deployment.spec.template.spec.containers[0]
    assert container.command is None and container.args[:3] == ["worker", "--queue", "emails"]
    env = {e.name: e.value_from for e in container.env}
    assert env["DATABASE_URL"].secret_key_ref.name == DB_SECRET
    assert env["POD_NAME"].field_ref.field_path == "metadata.name"
    assert deployment.spec.replicas == 0 and deployment.spec.template.spec.termination_grace_period_seconds == 30

    status = cluster.wait_for(lambda: cluster.queueworker("emails").get("status", {}).get("queueDepth") and
                              cluster.queueworker("emails")["status"], message="status filled")
    assert (status["replicas"], status["desiredReplicas"], status["reason"]) == (0, 0, "Idle")
    assert status["queueDepth"]["ready"] == 0 and status["observedGeneration"] == qw["metadata"]["generation"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Ready": "True", "ReplicaFailure": "False", "Active": "False", "Paused": "False",
                          "Fallback": "False", "Limited": "False", "DrainSafe": "True"}

    response = cluster.custom.list_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, _preload_content=False,
        _headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    table = json.loads(response.data)
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns == ["Name", "Queue", "Ready", "Running", "Desired", "Replicas", "Reason", "Age"]
    assert table["rows"][0]["cells"][:6] == ["emails", "emails", 0, 0, 0, 0]
    liveness = urllib.request.urlopen(f"http://127.0.0.1:{cluster.liveness_port}/healthz", timeout=5)
    assert liveness.status == 200  # the chart's livenessProbe


def test_missing_secret_is_reported_and_recovers_when_created(cluster: Cluster, dsn: str):
    cluster.apply("nosecret", {**worker_spec(maxReplicas=2), "database": {"secretRef": {"name": "later"}}})
    cluster.wait_for(lambda: cluster.condition("nosecret", "Ready").get("reason") == "SecretUnavailable",
                     message="Ready=False SecretUnavailable")
    (event,) = cluster.wait_for(lambda: cluster.events("SecretUnavailable"), message="Warning Event")
    assert event.type == "Warning" and "later" in event.message
    cluster.core.create_namespaced_secret(cluster.namespace,
                                          {"metadata": {"name": "later"}, "stringData": {"url": dsn}})
    cluster.wait_for(lambda: cluster.condition("nosecret", "Ready").get("status") == "True", message="Ready again")


def test_backlog_scales_up_in_one_step_drains_and_returns_to_min(cluster: Cluster, dsn: str):
    cluster.apply("sleepers", {**worker_spec(maxReplicas=4), "concurrency": 5})
    cluster.wait_for(lambda: cluster.queueworker("sleepers").get("status", {}).get("reason") == "Idle",
                     message="idle at zero")
    enqueued_at = time.monotonic()
    enqueue_sleeps(dsn, *[0.2] * 200)
    seen = [0]

    def replicas_changed() -> bool:
        replicas = cluster.replicas("sleepers")
        if replicas != seen[-1]:
            seen.append(replicas)
        return replicas != 0
    cluster.wait_for(replicas_changed, timeout=30, message="scale up")
    reaction = time.monotonic() - enqueued_at
    assert seen == [0, 4], f"one step to maxReplicas, saw {seen}"
    print(f"reaction time (backlog -> replicas patched): {reaction:.2f}s")

    cluster.wait_for(lambda: task_report(dsn)["states"] == {"succeeded": 200}, timeout=90,
                     message="200 tasks succeeded")
    assert task_report(dsn)["succeeded_more_than_once"] == 0
    cluster.wait_for(lambda: cluster.replicas("sleepers") == 0, timeout=30, message="back to minReplicas=0")
    # Each scale's Event is posted after the scale itself: wait for the last one.
    cluster.wait_for(lambda: {e.reason for e in cluster.events("Activated") + cluster.events("ScaledToZero")}
                     == {"Activated", "ScaledToZero"}, timeout=30, message="an Event for each scale")
    metrics = cluster.metrics()
    labels = f'name="sleepers",namespace="{cluster.namespace}"'  # the exposition sorts label names
    assert f'queueworker_controller_scale_total{{direction="up",{labels}}} 1.0' in metrics
    assert f"queueworker_controller_desired_replicas{{{labels}}} 0.0" in metrics
    assert "queueworker_controller_tick_duration_seconds_count" in metrics


def test_a_paused_queue_holds_its_deployment_and_a_rate_limited_one_scales_to_the_cap(cluster: Cluster, dsn: str):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.pause(conn, "jobs")
    cluster.apply("metered", {**worker_spec(maxReplicas=4), "concurrency": 5})
    enqueue_sleeps(dsn, *[0.2] * 100)
    cluster.wait_for(lambda: cluster.queueworker("metered").get("status", {}).get("reason") == "Paused",
                     timeout=30, message="the Paused decision")
    cluster.wait_for_ticks(3, "metered")  # three more polls
    assert cluster.replicas("metered") == 0, "a backlog that cannot start adds no pods"

    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.resume(conn, "jobs")
        operations.set_limits(conn, "jobs", rate_per_second=2)  # 2/s x 0.2 s per task: under one pod's 5 slots
    cluster.wait_for(lambda: cluster.queueworker("metered").get("status", {}).get("reason") == "LimitedByRate",
                     timeout=30, message="the LimitedByRate decision")
    seen = replicas_seen(cluster, "metered", polls=3)
    assert seen == {1}, f"one pod is all a 2/s limit keeps busy, not the 4 the backlog asks for: {seen}"
    cluster.wait_for(lambda: cluster.events("LimitedByRate"), timeout=10, message="the LimitedByRate Event")


def test_held_keys_add_no_pods_and_per_key_caps_bound_the_replicas(cluster: Cluster, dsn: str):
    """A backlog whose keys are all paused cannot start (KeysHeld); once they are resumed, what the
    keys may run at once bounds the replicas (LimitedByKeys), not the backlog's size."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "jobs", per_key_max_running=2)  # 2 keys x 2: under one pod's 5 slots
        for key in ("tenant-a", "tenant-b"):
            operations.pause(conn, "jobs", key=key)
        enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": 1}, "queue": "jobs", "key": key}
                            for key in ("tenant-a", "tenant-b") for _ in range(50)])
    cluster.apply("tenants", {**worker_spec(maxReplicas=4), "concurrency": 5})
    cluster.wait_for(lambda: cluster.queueworker("tenants").get("status", {}).get("reason") == "KeysHeld",
                     timeout=30, message="the KeysHeld decision")
    cluster.wait_for_ticks(2, "tenants")
    status = cluster.queueworker("tenants")["status"]
    assert cluster.replicas("tenants") == 0, "a backlog whose keys are all paused adds no pods"
    assert (status["queueDepth"]["keysReady"], status["queueDepth"]["keysHeld"]) == (2, 2)
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Limited"] == "KeysHeld"

    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        # Both at once: a read between two resumes would decide, and tell, for one key alone.
        for key in ("tenant-a", "tenant-b"):
            operations.resume(conn, "jobs", key=key)
    cluster.wait_for(lambda: cluster.queueworker("tenants").get("status", {}).get("reason") == "LimitedByKeys",
                     timeout=30, message="the LimitedByKeys decision")
    seen = replicas_seen(cluster, "tenants", polls=2)
    assert seen == {1}, f"one pod is all two keys of 2 running each keep busy, not the 4 of the backlog: {seen}"
    (event,) = cluster.wait_for(lambda: cluster.events("LimitedByKeys"), timeout=10, message="the LimitedByKeys Event")
    assert "its keys can run 4 tasks at once" in event.message
    conditions = {c["type"]: (c["status"], c["reason"]) for c in cluster.queueworker("tenants")["status"]["conditions"]}
    assert conditions["Limited"] == ("True", "LimitedByKeys")


def test_max_connections_bounds_the_replicas_below_min_replicas_with_limited_by_database(cluster: Cluster, dsn: str):
    """The database's connection budget bounds the replicas below what the backlog and minReplicas ask
    for (LimitedByDatabase: the decision, the Limited condition, status.queueDepth.connectionBudget),
    from the Deployment's creation on; a larger budget lets it scale up (to minReplicas first, as
    ever) as far as it holds, with a LimitedByDatabase Event. The server all the tests share cannot be given a small max_connections
    without starving them, so the budget here is the QueueWorker's own maxConnections
    (tests/test_connection_budget.py reads a server's budget): two replicas' connections and one more
    hold two replicas."""
    enqueue_sleeps(dsn, *[2.0] * 100)
    spec = worker_spec(minReplicas=3, maxReplicas=5)
    two, four = 2 * CONNECTIONS_PER_WORKER + 1, 4 * CONNECTIONS_PER_WORKER + 1
    cluster.apply("budgeted", {**spec, "database": {**spec["database"], "maxConnections": two}})
    cluster.wait_for(lambda: cluster.queueworker("budgeted").get("status", {}).get("reason") == "LimitedByDatabase",
                     timeout=30, message="the LimitedByDatabase decision")
    seen = replicas_seen(cluster, "budgeted", polls=2)
    assert seen == {2}, f"{two} connections hold 2 replicas, not minReplicas=3 nor the backlog's 5: {seen}"
    status = cluster.queueworker("budgeted")["status"]
    assert status["queueDepth"]["connectionBudget"] == two
    assert f"budget of {two} connections for these workers, {CONNECTIONS_PER_WORKER} per replica" in status["message"]
    assert {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}["Limited"] == \
        ("True", "LimitedByDatabase")

    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "budgeted", {
        "spec": {"database": {"maxConnections": four}}})
    (event,) = cluster.wait_for(lambda: cluster.events("LimitedByDatabase"), timeout=30,
                                message="the LimitedByDatabase Event")
    assert "-> 4 replicas" in event.message and f"budget of {four} connections" in event.message, event.message
    assert replicas_seen(cluster, "budgeted", polls=2) == {4}, f"{four} connections hold 4 replicas, not the backlog's 5"


def test_lookahead_starts_the_pods_of_a_scheduled_burst_before_it_is_due(cluster: Cluster, dsn: str):
    cluster.apply("ahead", {**worker_spec(maxReplicas=3, lookaheadSeconds=60), "concurrency": 2})
    cluster.apply("behind", {**worker_spec(maxReplicas=3), "concurrency": 2, "queue": "later"})
    with psycopg.connect(dsn) as conn:
        enqueue_many(conn, [{"task": "qw.sleep", "payload": {"seconds": 0.1}, "queue": queue, "delay": 45}
                            for queue in ("jobs", "later") for _ in range(6)])
    cluster.wait_for(lambda: cluster.replicas("ahead") == 3, timeout=30, message="pods for the burst due in 45 s")
    # The scale is written before the status that reports it.
    depth = cluster.wait_for(lambda: cluster.queueworker("ahead").get("status", {}).get("queueDepth", {}).get(
        "dueSoon") == 6 and cluster.queueworker("ahead")["status"]["queueDepth"], timeout=10, message="dueSoon 6")
    assert depth["ready"] == 0
    (event,) = cluster.wait_for(lambda: cluster.events("DueSoon"), timeout=10, message="the DueSoon Event")
    assert "6 due within the lookahead" in event.message
    cluster.wait_for(lambda: cluster.queueworker("behind").get("status", {}).get("reason") == "Idle", timeout=10,
                     message="the QueueWorker without a lookahead idle")
    assert cluster.replicas("behind") == 0, "without a lookahead, nothing is ready yet"


def test_a_retry_due_after_the_fleet_went_to_zero_brings_it_back(cluster: Cluster, dsn: str):
    """A task whose backoff ends after its workers scaled away (here: written as such before the
    QueueWorker exists): no scheduler runs at zero replicas to admit it to the claim index, so the
    controller must count it once due, and keep polling while it waits (no NOTIFY will announce it)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        (task_id,) = conn.execute(
            "INSERT INTO queueworker.tasks (queue, task, payload, state, delayed, attempts, max_attempts, run_after) "
            "VALUES ('jobs', 'qw.noop', '{}', 'retrying', false, 1, 3, now() + interval '1 hour') RETURNING id").fetchone()
    cluster.apply("comeback", worker_spec(maxReplicas=2))
    status = cluster.wait_for(lambda: (status := cluster.queueworker("comeback").get("status", {})).get("reason")
                              == "Idle" and status, timeout=30, message="idle at zero while the retry waits")
    assert status["queueDepth"]["retrying"] == 1
    with psycopg.connect(dsn, autocommit=True) as conn:  # its backoff ends (an update sends no NOTIFY)
        conn.execute("UPDATE queueworker.tasks SET run_after = now() WHERE id = %s", (task_id,))
    cluster.wait_for(lambda: cluster.replicas("comeback") == 1, timeout=30, message="the due retry to activate")
    cluster.wait_for(lambda: task_report(dsn)["states"] == {"succeeded": 1}, timeout=60,
                     message=f"task {task_id} to run on the new pod")


def test_max_wait_adds_a_replica_per_poll_while_the_oldest_task_waits(cluster: Cluster, dsn: str):
    """Four long tasks at 100 per replica: the count asks for one replica; the wait limit adds one
    per poll while a task waits past two seconds, up to maxReplicas."""
    cluster.apply("patient", {**worker_spec(maxReplicas=3, maxWaitSeconds=2, tasksPerReplica=100),
                              "concurrency": 1})
    seen = [0]

    def replicas_seen() -> int:
        replicas = cluster.replicas("patient")
        if replicas != seen[-1]:
            seen.append(replicas)
        return replicas
    enqueue_sleeps(dsn, *[30.0] * 4)
    cluster.wait_for(lambda: replicas_seen() == 3, timeout=40, message="three replicas")
    assert seen == [0, 1, 2, 3], f"activated at one, then one more per poll: {seen}"
    events = cluster.wait_for(lambda: (lambda e: len(e) == 2 and e)(cluster.events("WaitTooLong")), timeout=10,
                              message="two WaitTooLong Events")
    assert "over maxWaitSeconds=2" in events[0].message


def test_throughput_floor_keeps_the_pods_a_steady_flow_keeps_busy(cluster: Cluster, dsn: str):
    """A minute of history at 2 finishes/s, 3 s each (6 busy slots), and one task ready now: the count
    asks for one replica of 2 slots, the floor for three."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, started_at, finished_at)
                        SELECT 'jobs', 'qw.sleep', 'succeeded', false, 1, now() - make_interval(secs => i * 0.5 + 3),
                               now() - make_interval(secs => i * 0.5)
                        FROM generate_series(0, 119) AS i""")
    enqueue_sleeps(dsn, 30.0)
    cluster.apply("steady", {**worker_spec(maxReplicas=5, throughputFloor=True), "concurrency": 2})
    cluster.wait_for(lambda: cluster.replicas("steady") == 3, timeout=30, message="the floor of three")
    status = cluster.wait_for(lambda: (lambda s: s if s.get("reason") == "ThroughputFloor" else None)(
        cluster.queueworker("steady").get("status", {})), timeout=10, message="the floor holding three")
    # The history ages while the controller gets to it: a read a few seconds late finds fewer of its
    # 120 finishes within the last minute. Three replicas of 2 slots hold for any rate above 4/3 a
    # second (more than 4 slots busy), at most the 2 a second the history has: 5 or 6 slots.
    assert re.search(r"keep [56] slots busy", status["message"]), status
    assert 4 / 3 < status["queueDepth"]["finishRate"] <= 2.0, status
    assert status["queueDepth"]["recentTaskSeconds"] == pytest.approx(3.0, abs=0.05)
    (activated,) = cluster.wait_for(lambda: cluster.events("Activated"), timeout=10, message="the Activated Event")
    assert re.search(r"keep [56] slots busy", activated.message), activated.message


def test_scale_down_spares_busy_pods_and_a_deleted_busy_pod_loses_nothing(cluster: Cluster, dsn: str):
    cluster.apply("mixed", worker_spec(maxReplicas=3, cooldownSeconds=600))
    (long_task, *_) = enqueue_sleeps(dsn, 20, 0.5, 0.5)
    cluster.wait_for(lambda: cluster.replicas("mixed") == 3, timeout=30, message="3 replicas")
    busy_pod = cluster.wait_for(lambda: lease_holders(dsn).get(long_task), timeout=60, message="long task leased")

    cluster.wait_for(lambda: cluster.replicas("mixed") == 1, timeout=40, message="scale-in to 1")
    survivors = cluster.wait_for(lambda: (lambda pods: len(pods) == 1 and pods)(cluster.pods("mixed")), timeout=30,
                                 message="one pod left")
    assert survivors[0].metadata.name == busy_pod, "the pod holding a lease was deleted on scale-in"
    assert int(survivors[0].metadata.annotations[DELETION_COST_ANNOTATION]) > 0
    assert lease_holders(dsn).get(long_task) == busy_pod  # still running where it was

    # Deleting the busy pod: it drains for 1 s, hands the task back, and the replacement finishes it.
    cluster.core.delete_namespaced_pod(busy_pod, cluster.namespace)
    cluster.wait_for(lambda: task_report(dsn)["states"] == {"succeeded": 3}, timeout=90, message="all succeeded")
    with psycopg.connect(dsn) as conn:
        transitions = conn.execute("SELECT from_state::text, to_state::text FROM queueworker.task_events "
                                   "WHERE task_id = %s ORDER BY id", (long_task,)).fetchall()
        attempts = conn.execute("SELECT attempts FROM queueworker.tasks WHERE id = %s", (long_task,)).fetchone()[0]
    assert ("running", "pending") in transitions  # released, not lost to a lease expiry
    assert transitions.count(("running", "succeeded")) == 1 and attempts == 1
    assert task_report(dsn)["succeeded_more_than_once"] == 0


def all_pods(cluster: Cluster, name: str) -> set[str]:
    """The QueueWorker's pods, terminating ones included."""
    return {p.metadata.name for p in cluster.core.list_namespaced_pod(
        cluster.namespace, label_selector=f"{OWNER_LABEL}={name}").items}


def interruptions(dsn: str, ids: list[int]) -> list[tuple[int, str]]:
    """(task, error type) of every running -> pending hand-back of these tasks."""
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT task_id, detail ->> 'error_type' FROM queueworker.task_events "
                            "WHERE task_id = ANY(%s) AND from_state = 'running' AND to_state = 'pending'",
                            (ids,)).fetchall()


def test_wait_for_idle_rollouts_and_scale_ins_interrupt_no_task(cluster: Cluster, dsn: str):
    """Two pods run a 20 s task each when the template changes: the new pods come up, the old ones
    stop claiming, finish their tasks and only then go. Then a scale-in while both run a task: the
    surplus pod finishes its task before it goes. No task is handed back, none runs twice."""
    cluster.apply("patient", {**worker_spec(minReplicas=2, maxReplicas=2, cooldownSeconds=600),
                              "rollout": {"strategy": "WaitForIdle", "maxWaitSeconds": 120}})
    first = enqueue_sleeps(dsn, 20, 20)
    holders = cluster.wait_for(lambda: (lambda h: len(set(h.values())) == 2 and h)(lease_holders(dsn)),
                               timeout=90, message="both pods running a task")
    old_pods = set(holders.values())
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "patient", {
        "spec": {"template": {"metadata": {"labels": {"revision": "2"}}}}})
    new_pods = cluster.wait_for(lambda: (lambda new: len(new) == 2 and new)(
        {p.metadata.name for p in cluster.pods("patient")} - old_pods), timeout=60, message="the new pods")
    assert set(lease_holders(dsn).values()) == old_pods, "the old pods still run their tasks"
    cluster.wait_for(lambda: task_report(dsn)["states"] == {"succeeded": 2}, timeout=60, message="both finished")
    cluster.wait_for(lambda: all_pods(cluster, "patient") == new_pods, timeout=30, message="the old pods gone")
    assert interruptions(dsn, first) == []
    assert "DrainSafe" in {c["type"] for c in cluster.queueworker("patient")["status"]["conditions"]
                           if c["status"] == "True"}

    second = enqueue_sleeps(dsn, 20, 20)
    cluster.wait_for(lambda: len(set(lease_holders(dsn).values())) == 2, timeout=60, message="both busy again")
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "patient", {
        "spec": {"scaling": {"minReplicas": 1, "maxReplicas": 1}}})
    cluster.wait_for(lambda: cluster.replicas("patient") == 1, timeout=30, message="scale-in to 1")
    assert len(all_pods(cluster, "patient")) == 2, "the surplus pod is still finishing its task"
    cluster.wait_for(lambda: task_report(dsn)["states"] == {"succeeded": 4}, timeout=60, message="all finished")
    cluster.wait_for(lambda: len(all_pods(cluster, "patient")) == 1, timeout=30, message="the surplus pod gone")
    assert interruptions(dsn, first + second) == []
    assert task_report(dsn)["succeeded_more_than_once"] == 0


def test_a_drained_task_says_so_in_its_audit_trail(cluster: Cluster, dsn: str):
    """The default strategy, Drain, for contrast: a 20 s task on a pod deleted with a 1 s drain is
    handed back, and its audit row says it was a drain."""
    cluster.apply("hasty", worker_spec(minReplicas=1, maxReplicas=1))
    (task,) = enqueue_sleeps(dsn, 20)
    pod = cluster.wait_for(lambda: lease_holders(dsn).get(task), timeout=60, message="the task running")
    cluster.core.delete_namespaced_pod(pod, cluster.namespace)
    cluster.wait_for(lambda: interruptions(dsn, [task]), timeout=30, message="the hand-back")
    assert interruptions(dsn, [task]) == [(task, "Drained")]


def test_a_scale_target_of_the_users_own_is_scaled_and_otherwise_left_alone(cluster: Cluster, dsn: str):
    """A Deployment the user ships (their labels, annotations, container, grace period) and a
    QueueWorker with scaleTargetRef: until the Deployment opts in (names the QueueWorker in its
    scaled-by annotation) it is never scaled; then the backlog scales it through /scale, nothing else
    on it changes, and deleting the QueueWorker leaves it in place."""
    labels = {"app": "mine"}
    cluster.apps.create_namespaced_deployment(cluster.namespace, {
        "metadata": {"name": "mine", "labels": {"team": "a"}, "annotations": {"example.com/owner": "me"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"terminationGracePeriodSeconds": 15, "containers": [{
                "name": "app", "image": "queueworker:test",
                "args": ["worker", "--builtin-tasks", "--queue", "jobs", "--concurrency", "1", "--drain-seconds", "2"],
                "env": [{"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": DB_SECRET, "key": "url"}}},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]}]}}}})
    spec = {k: v for k, v in worker_spec(maxReplicas=3, tasksPerReplica=1).items() if k != "image"}
    cluster.apply("theirs", {**spec, "scaleTargetRef": {"kind": "Deployment", "name": "mine"}})
    enqueue_sleeps(dsn, 3, 3, 3)
    cluster.wait_for(lambda: cluster.queueworker("theirs").get("status", {}).get("reason") == "ScaleTargetNotOptedIn",
                     timeout=30, message="a target that did not opt in refused")
    assert cluster.apps.read_namespaced_deployment("mine", cluster.namespace).spec.replicas == 0, "never scaled"
    cluster.apps.patch_namespaced_deployment("mine", cluster.namespace, {
        "metadata": {"annotations": {SCALED_BY_ANNOTATION: "theirs"}}})  # the owner opts in
    before = cluster.apps.read_namespaced_deployment("mine", cluster.namespace).to_dict()
    cluster.wait_for(lambda: cluster.apps.read_namespaced_deployment("mine", cluster.namespace).spec.replicas == 3,
                     timeout=30, message="the user's Deployment scaled to 3")
    def reported() -> dict | None:  # the scale is written before the status that reports it
        status = cluster.queueworker("theirs").get("status", {})
        return status if status.get("scaleTarget") else None

    status = cluster.wait_for(reported, timeout=30, message="the status reporting the scale")
    assert status["scaleTarget"] == "Deployment/mine" and "deployment" not in status
    assert {c["type"]: c["status"] for c in status["conditions"]}["DrainSafe"] == "True"
    assert not cluster.apps.list_namespaced_deployment(cluster.namespace, label_selector=f"{OWNER_LABEL}=theirs").items
    cluster.wait_for(lambda: task_report(dsn)["states"] == {"succeeded": 3}, timeout=90, message="their pods ran it")
    cluster.wait_for(lambda: cluster.apps.read_namespaced_deployment("mine", cluster.namespace).spec.replicas == 0,
                     timeout=30, message="scaled back to zero")
    after = cluster.apps.read_namespaced_deployment("mine", cluster.namespace).to_dict()
    for part in ("selector", "template", "strategy", "revision_history_limit", "progress_deadline_seconds"):
        assert after["spec"][part] == before["spec"][part], part
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    assert {k: v for k, v in after["metadata"]["annotations"].items() if not k.startswith("deployment.kubernetes.io/")} \
        == {k: v for k, v in before["metadata"]["annotations"].items() if not k.startswith("deployment.kubernetes.io/")}
    assert not after["metadata"]["owner_references"]
    cluster.delete_queueworkers()
    cluster.wait_for(lambda: cluster.forgotten("theirs"), timeout=30, message="the controller done with theirs")
    assert cluster.apps.read_namespaced_deployment("mine", cluster.namespace).spec.replicas == 0, "still there"


def test_database_outage_holds_replicas_says_why_and_recovers(cluster: Cluster, dsn: str, local_postgres):
    cluster.apply("steady", worker_spec(maxReplicas=3))
    enqueue_sleeps(dsn, 120, 120)
    cluster.wait_for(lambda: cluster.replicas("steady") == 2, timeout=30, message="2 replicas")
    local_postgres.stop()
    try:
        cluster.wait_for(lambda: cluster.condition("steady", "Ready").get("reason") == "DatabaseUnreachable",
                         timeout=30, message="Ready=False DatabaseUnreachable")
        assert cluster.condition("steady", "Ready")["status"] == "False"
        cluster.wait_for(lambda: cluster.events("DatabaseUnreachable"), timeout=15, message="Warning Event")
        cluster.wait_for_ticks(7, "steady")  # at a poll a second, three times stabilization + cooldown
        assert cluster.replicas("steady") == 2
        assert cluster.queueworker("steady")["status"]["reason"] == "HoldingOnError"
    finally:
        local_postgres.start()
    cluster.wait_for(lambda: cluster.condition("steady", "Ready").get("status") == "True", timeout=30,
                     message="Ready again")
    cluster.wait_for(lambda: cluster.events("Recovered"), timeout=15, message="Recovered Event")
    assert cluster.replicas("steady") == 2


INVALID = [
    ("bad-type", {"concurrency": "ten"}, "spec.concurrency in body must be of type integer"),
    ("min-above-max", {"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must not be greater"),
    ("missing-queue", {"queue": None}, "spec.queue: Required value"),
    ("empty-queue", {"queue": ""}, "spec.queue: Invalid value"),
    ("negative-min", {"scaling": {"minReplicas": -1}}, "spec.scaling.minReplicas: Invalid value: -1"),
    ("zero-concurrency", {"concurrency": 0}, "spec.concurrency: Invalid value: 0"),
    ("unknown-field", {"replicas": 3}, "unknown field \"spec.replicas\""),
    ("inline-password", {"database": {"url": "postgresql://u:p@db/app"}}, 'unknown field "spec.database.url"'),
    ("fallback-above-max", {"scaling": {"maxReplicas": 2, "fallbackReplicas": 5}},
     "fallbackReplicas must lie between"),
    ("short-lease", {"leaseSeconds": 1}, "spec.leaseSeconds: Invalid value: 1"),
    ("image-and-target", {"scaleTargetRef": {"kind": "Deployment", "name": "mine"}}, "either image"),
    ("neither-image-nor-target", {"image": None}, "either image"),
    ("target-without-name", {"image": None, "scaleTargetRef": {"kind": "Deployment"}},
     "spec.scaleTargetRef.name: Required value"),
    ("unknown-rollout", {"rollout": {"strategy": "Recreate"}}, "spec.rollout.strategy: Unsupported value"),
    ("negative-wait", {"scaling": {"maxWaitSeconds": 0}}, "spec.scaling.maxWaitSeconds: Invalid value: 0"),
]


@pytest.mark.parametrize(("case", "change", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_queueworkers_are_rejected_with_a_clear_message(control_plane, crd, cluster_namespace,
                                                                 case, change, message):
    spec = {"queue": "q", "image": "i", "database": {"secretRef": {"name": "db"}}, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    with control_plane.api_client() as api:
        with pytest.raises(ApiException) as raised:
            create_queueworker(api, cluster_namespace, case, spec)
    assert raised.value.status in (400, 422)
    assert message in json.loads(raised.value.body)["message"]


def test_controller_identity_has_only_the_chart_rules(control_plane, controller_kubeconfig):
    """The tests above ran as this ServiceAccount; it must not be an admin in disguise."""
    from kubernetes import config
    api = config.new_client_from_config(config_file=str(controller_kubeconfig))
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"verb": "delete", "resource": "pods", "namespace": "default"}}})
    assert review.status.allowed is False
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"verb": "patch", "resource": "deployments", "subresource": "scale",
                                         "group": "apps", "namespace": "default"}}})
    assert review.status.allowed is True
    for namespace, allowed in ((SYSTEM_NAMESPACE, True), ("default", False)):  # the Lease: its own namespace only
        review = client.AuthorizationV1Api(api).create_self_subject_access_review(
            {"spec": {"resourceAttributes": {"verb": "update", "resource": "leases", "group": "coordination.k8s.io",
                                             "namespace": namespace}}})
        assert review.status.allowed is allowed, namespace


def test_spec_changes_roll_the_deployment_and_paused_leaves_kubectl_scale_alone(cluster: Cluster, dsn: str):
    cluster.apply("rolling", worker_spec(maxReplicas=3))
    cluster.wait_for(lambda: cluster.queueworker("rolling").get("status", {}).get("reason") == "Idle", message="idle")
    patch = {"spec": {"concurrency": 3, "scaling": {"paused": True}}}
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "rolling", patch)
    cluster.wait_for(lambda: "3" in cluster.apps.read_namespaced_deployment(
        "rolling-worker", cluster.namespace).spec.template.spec.containers[0].args, message="new args rolled out")
    cluster.wait_for(lambda: cluster.condition("rolling", "Paused").get("status") == "True", message="Paused=True")

    cluster.apps.patch_namespaced_deployment_scale("rolling-worker", cluster.namespace, {"spec": {"replicas": 2}})
    # Idle at zero with its database listening, it polls only every minute: an announcement has it
    # look now, and at two replicas it polls every second from then on.
    announce(dsn, "jobs")
    cluster.wait_for_ticks(4, "rolling")  # several polls with an empty queue: unpaused, this would be scaled to zero
    assert cluster.replicas("rolling") == 2
    assert cluster.queueworker("rolling")["status"]["reason"] == "Paused"

    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "rolling",
                                                  {"spec": {"scaling": {"paused": False}}})
    cluster.wait_for(lambda: cluster.replicas("rolling") == 0, timeout=30, message="scaling resumed")



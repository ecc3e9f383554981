"""The controller against a real cluster, as an attacker or a careless tenant would try it: what a
QueueWorker may not ask for (no confused deputy), Secret values that never leak, a hung database
that cannot slow the others, and memory that stays bounded (rotation, reference counting, the
metrics of deleted QueueWorkers). The harness is tests/controller_cluster.py."""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from kubernetes.client.rest import ApiException

from queueworker.db.migrate import migrate
from queueworker_controller.deployment import SECRET_VERSION_ANNOTATION
from queueworker_controller.reconcile import SECRET_REFRESH_SECONDS
from queueworker.scaling.resource import GROUP, PLURAL, VERSION
from tests.controller_cluster import Cluster, DB_SECRET, create_queueworker, ERRORS, cluster, enqueue_sleeps, running_controller, task_report, worker_spec  # noqa: F401 (cluster: a fixture)
from tests.hanging_servers import FloodingPostgres, SilentServer, StalledPostgres
from tests.pod_templates import ALLOWED, REFUSED

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


# --- no confused deputy: what a QueueWorker may not ask for -----------------------------------------------

CEL_REFUSED = [c for c in REFUSED if c.cel]


@pytest.mark.parametrize("case", CEL_REFUSED, ids=[c.id for c in CEL_REFUSED])
def test_the_api_server_refuses_privileged_templates(control_plane, crd, cluster_namespace, case):
    spec = {"queue": "q", "image": "i", "database": {"secretRef": {"name": "db"}}, "template": case.template}
    with control_plane.api_client() as api:
        with pytest.raises(ApiException) as raised:
            create_queueworker(api, cluster_namespace, case.id, spec)
    assert raised.value.status == 422
    message = json.loads(raised.value.body)["message"]
    assert f"spec.template.{case.api_path}: Forbidden" in message, message


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_the_api_server_accepts_what_workers_legitimately_need(control_plane, crd, cluster_namespace, name):
    spec = {"queue": "q", "image": "i", "database": {"secretRef": {"name": "db"}}, "template": ALLOWED[name]}
    with control_plane.api_client() as api:
        create_queueworker(api, cluster_namespace, name, spec, dry_run="All")


def test_the_controller_refuses_what_the_crd_cannot_see_and_leaves_the_deployment_alone(cluster: Cluster):
    """A probe aimed at another host (the schema does not type probes) and a volume source the
    schema does not name get past the API server; the controller refuses them on the merged pod."""
    cluster.apply("probe", worker_spec(maxReplicas=1))
    before = cluster.wait_for(lambda: cluster.apps.read_namespaced_deployment("probe-worker", cluster.namespace),
                              message="Deployment probe-worker")
    cluster.wait_for(lambda: cluster.condition("probe", "Ready").get("status") == "True", message="Ready")
    (probe,) = [c for c in REFUSED if c.id == "probe-other-host"]
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "probe",
                                                  {"spec": {"template": probe.template}})
    ready = cluster.wait_for(lambda: (lambda c: c.get("reason") == "InvalidSpec" and c)(
        cluster.condition("probe", "Ready")), message="Ready=False InvalidSpec")
    assert ready["status"] == "False" and probe.path in ready["message"]
    (event,) = cluster.wait_for(lambda: cluster.events("InvalidSpec"), message="Warning Event")
    assert event.type == "Warning" and probe.path in event.message
    after = cluster.apps.read_namespaced_deployment("probe-worker", cluster.namespace)
    assert after.metadata.generation == before.metadata.generation, "the Deployment was changed"

    (odd_volume,) = [c for c in REFUSED if c.id == "unknown-volume-source"]
    cluster.apply("odd", {**worker_spec(), "template": odd_volume.template})
    cluster.wait_for(lambda: cluster.condition("odd", "Ready").get("reason") == "InvalidSpec",
                     message="Ready=False InvalidSpec")
    with pytest.raises(ApiException) as missing:
        cluster.apps.read_namespaced_deployment("odd-worker", cluster.namespace)
    assert missing.value.status == 404
    cluster.wait_for_ticks(3, "odd", counter=ERRORS)  # several polls: one Event, no retry loop
    assert len(cluster.events("InvalidSpec")) == 2
    assert "failed with an exception" not in cluster.controller_log.read_text()


def test_no_queueworker_runs_its_pods_as_the_controllers_own_service_account(
        control_plane, cluster_namespace, controller_kubeconfig, dsn, tmp_path):
    """A controller told its own ServiceAccount (`--service-account`, from the chart's downward API
    variables in a pod) refuses QueueWorkers of that namespace whose pods would run as it."""
    with running_controller(control_plane, cluster_namespace, controller_kubeconfig, dsn, tmp_path,
                            "--service-account", f"{cluster_namespace}/queueworker-controller") as cluster:
        cluster.apply("borrower", {**worker_spec(), "template": {"spec": {"serviceAccountName": "queueworker-controller"}}})
        ready = cluster.wait_for(lambda: (lambda c: c.get("reason") == "InvalidSpec" and c)(
            cluster.condition("borrower", "Ready")), message="Ready=False InvalidSpec")
        assert "queueworker-controller is the controller's own ServiceAccount" in ready["message"]
        with pytest.raises(ApiException) as missing:
            cluster.apps.read_namespaced_deployment("borrower-worker", cluster.namespace)
        assert missing.value.status == 404


def test_worker_pods_pass_pod_security_restricted_and_refused_pods_are_reported(cluster: Cluster, dsn: str):
    cluster.enforce_restricted()
    cluster.apply("strict", worker_spec(maxReplicas=2))
    enqueue_sleeps(dsn, 0.2, 0.2, 0.2)
    pods = cluster.wait_for(lambda: cluster.pods("strict"), timeout=30, message="worker pods admitted")
    cluster.wait_for(lambda: task_report(dsn)["states"] == {"succeeded": 3}, timeout=60, message="tasks done")
    pod = pods[0].spec
    assert pod.security_context.run_as_non_root is True and pod.security_context.run_as_user == 10001
    assert pod.security_context.seccomp_profile.type == "RuntimeDefault"
    assert pod.automount_service_account_token is False
    (worker,) = pod.containers
    assert worker.security_context.read_only_root_filesystem is True
    assert worker.security_context.allow_privilege_escalation is False
    assert worker.security_context.capabilities.drop == ["ALL"]
    assert cluster.condition("strict", "ReplicaFailure")["status"] == "False"

    # A sidecar without a security context passes the controller (nothing in it is privileged) but
    # not the namespace's "restricted" level: the ReplicaSet cannot create the pods.
    sidecar = {"spec": {"containers": [{"name": "proxy", "image": "proxy:1"}]}}
    cluster.apply("sidecar", {**worker_spec(minReplicas=1, maxReplicas=1), "template": sidecar})

    def deployment_conditions() -> str:
        deployment = cluster.apps.read_namespaced_deployment("sidecar-worker", cluster.namespace)
        return f"ReplicaFailure=True; the Deployment's conditions: {deployment.status.conditions}"
    failure = cluster.wait_for(lambda: (lambda c: c.get("status") == "True" and c)(
        cluster.condition("sidecar", "ReplicaFailure")), timeout=30, message=deployment_conditions)
    assert failure["reason"] == "FailedCreate" and 'violates PodSecurity "restricted' in failure["message"]
    (event,) = cluster.wait_for(lambda: [e for e in cluster.events("FailedCreate")
                                         if e.involved_object.kind == "QueueWorker"], message="Warning Event")
    assert event.type == "Warning" and event.involved_object.name == "sidecar"
    assert not cluster.pods("sidecar")


# --- secrets never leak -------------------------------------------------------------------------------------

PASSWORD_ROLE = "qw_password_role"


@pytest.fixture
def password_auth(local_postgres, postgres) -> Iterator[str]:
    """A role that must give its password (scram over TCP) on the session's server; yields its name."""
    _, admin = postgres
    hba = local_postgres.data_dir / "pg_hba.conf"
    original = hba.read_text()
    hba.write_text(f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n{original}")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD 'the-right-one'")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield PASSWORD_ROLE
    finally:
        hba.write_text(original)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"DROP ROLE {PASSWORD_ROLE}")


def test_hostile_secret_values_never_reach_status_events_or_logs(cluster: Cluster, dsn: str, password_auth: str):
    port = psycopg.conninfo.conninfo_to_dict(dsn)["port"]
    secrets = {  # name: (value, the reason, words of the explanation, what must never be shown)
        "token": ("ghp_R3allyS3cretT0kenValue0123456789", "InvalidDatabaseUrl",
                  "not a valid Postgres connection string", "R3allyS3cretT0ken"),
        "typo": (f"postgresq://app:Typo-Pa55word@127.0.0.1:{port}/app", "InvalidDatabaseUrl", "scheme",
                 "Typo-Pa55word"),
        "bad-port": ("postgresql://app:Port-Pa55word@127.0.0.1:54x2/app", "InvalidDatabaseUrl",
                     "port that is not a number", "Port-Pa55word"),
        "binary": (b"\xff\xfe\x00postgresql://app:Binary-Pa55word@db/app", "InvalidDatabaseUrl", "not UTF-8 text",
                   "Binary-Pa55word"),
        "nul": ("postgresql://app:Nul-Pa55word@db/app\x00", "InvalidDatabaseUrl", "NUL byte", "Nul-Pa55word"),
        "huge": ("H" * 900_000, "InvalidDatabaseUrl", "900000 bytes long", "HHHHHHHH"),
        "wrong-password": (f"postgresql://{password_auth}:Wrong-Pa55word@127.0.0.1:{port}/postgres",
                           "DatabaseUnreachable", f'password authentication failed for user "{password_auth}"',
                           "Wrong-Pa55word"),
    }
    for name, (value, *_rest) in secrets.items():
        cluster.secret(f"db-{name}", value)
        cluster.apply(name, {**worker_spec(), "database": {"secretRef": {"name": f"db-{name}"}}})
    for name, (_, reason, explanation, _) in secrets.items():
        ready = cluster.wait_for(lambda: (lambda c: c.get("reason") == reason and c)(cluster.condition(name, "Ready")),
                                 timeout=30, message=f"{name}: Ready=False {reason}")
        assert explanation in ready["message"], (name, ready["message"])
    cluster.wait_for_ticks(2, *secrets)  # a few more ticks of each
    shown = json.dumps([cluster.queueworker(name).get("status") for name in secrets])
    shown += json.dumps([(e.reason, e.message) for e in cluster.events()])
    logged = cluster.controller_log.read_text(errors="replace")
    for name, (_, _, _, never) in secrets.items():
        assert never not in shown, f"{name}: the Secret value reached a status field or an Event"
        assert never not in logged, f"{name}: the Secret value reached the controller's log"
    assert "failed with an exception" not in logged  # no kopf retry loop: every error is a condition
    warnings = [(e.involved_object.name, e.reason) for e in cluster.events() if e.type == "Warning"]
    assert len(warnings) == len(secrets), warnings  # one each


# --- one slow database cannot freeze the controller ----------------------------------------------------------

def test_hung_databases_do_not_slow_a_healthy_queueworker(cluster: Cluster, dsn: str):
    """Six QueueWorkers on servers that hang (three never answer the connection, three complete the
    startup and never answer a query) must not delay the QueueWorker whose database is healthy."""
    silent, stalled = SilentServer(), StalledPostgres()
    try:
        for i, server in enumerate([silent] * 3 + [stalled] * 3):
            cluster.secret(f"hung-{i}", server.dsn(password=f"hung-pw-{i}"))
            cluster.apply(f"hung-{i}", {**worker_spec(), "queue": f"q{i}",
                                        "database": {"secretRef": {"name": f"hung-{i}"}}})
        for i in range(6):
            ready = cluster.wait_for(lambda: (lambda c: c.get("reason") == "DatabaseUnreachable" and c)(
                cluster.condition(f"hung-{i}", "Ready")), timeout=40, message=f"hung-{i} DatabaseUnreachable")
            assert "timed out" in ready["message"]
        assert stalled.connections and silent.connections  # the controller really was waiting on them

        cluster.apply("healthy", worker_spec(maxReplicas=2))
        cluster.wait_for(lambda: cluster.queueworker("healthy").get("status", {}).get("reason") == "Idle",
                         timeout=30, message="healthy QueueWorker idle")
        enqueued_at = time.monotonic()
        enqueue_sleeps(dsn, *[0.2] * 4)
        cluster.wait_for(lambda: cluster.replicas("healthy") == 2, timeout=15,
                         message="the healthy QueueWorker scaled within 15 s while six others hang")
        print(f"reaction time with six hung databases: {time.monotonic() - enqueued_at:.2f}s")
        liveness = urllib.request.urlopen(f"http://127.0.0.1:{cluster.liveness_port}/healthz", timeout=5)
        assert liveness.status == 200
        assert "hung-pw-" not in cluster.controller_log.read_text()
    finally:
        silent.close()
        stalled.close()


def peak_memory_kib(metrics_port: int) -> int:
    """The controller process's peak resident memory (VmHWM), found by its --metrics-port."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if f"--metrics-port\0{metrics_port}\0".encode() in cmdline.read_bytes():
                status = (cmdline.parent / "status").read_text()
                return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
        except OSError:
            continue
    raise LookupError("no controller process with that metrics port")


def test_a_flooding_database_and_a_url_reaching_for_files_fail_alone(cluster: Cluster, dsn: str):
    """A server that answers every query with a 100 MiB row, and a URL that names a file of the
    controller's container: each QueueWorker says why in one line, the controller stays under the
    chart's 256 Mi memory limit, and a healthy QueueWorker still scales."""
    flooding = FloodingPostgres(row_bytes=100 << 20)
    try:
        cluster.secret("flood", flooding.dsn(password="flood-pw"))
        cluster.apply("flood", {**worker_spec(), "queue": "flood", "database": {"secretRef": {"name": "flood"}}})
        port = psycopg.conninfo.conninfo_to_dict(dsn)["port"]
        cluster.secret("files", f"postgresql://app:Files-Pa55word@127.0.0.1:{port}/app"
                                f"?sslkey=/var/run/secrets/kubernetes.io/serviceaccount/token")
        cluster.apply("files", {**worker_spec(), "database": {"secretRef": {"name": "files"}}})
        flooded = cluster.wait_for(lambda: (lambda c: c.get("reason") == "DatabaseUnreachable" and c)(
            cluster.condition("flood", "Ready")), timeout=40, message="flood DatabaseUnreachable")
        assert re.search(r"the server sent more than \d+ KiB for one read: connection closed", flooded["message"])
        refused = cluster.wait_for(lambda: (lambda c: c.get("reason") == "InvalidDatabaseUrl" and c)(
            cluster.condition("files", "Ready")), timeout=30, message="files InvalidDatabaseUrl")
        assert "sets sslkey" in refused["message"] and "serviceaccount" not in refused["message"]
        cluster.wait_for_ticks(3, "flood")  # the flood again and again

        cluster.apply("healthy", worker_spec(maxReplicas=2))
        cluster.wait_for(lambda: cluster.queueworker("healthy").get("status", {}).get("reason") == "Idle",
                         timeout=30, message="healthy QueueWorker idle")
        enqueue_sleeps(dsn, *[0.2] * 4)
        cluster.wait_for(lambda: cluster.replicas("healthy") == 2, timeout=15,
                         message="the healthy QueueWorker scaled while another database floods")
        peak = peak_memory_kib(cluster.metrics_port)
        print(f"controller peak memory with a flooding database: {peak / 1024:.0f} MiB")
        assert peak < 256 * 1024
        logged = cluster.controller_log.read_text(errors="replace")
        assert "flood-pw" not in logged and "Files-Pa55word" not in logged
    finally:
        flooding.close()


# --- bounded memory: rotation, reference counting, metrics of deleted QueueWorkers ------------------------

def controller_sessions(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND application_name LIKE 'queueworker-controller%'").fetchone()[0]


def test_a_rotated_secret_moves_the_reads_rolls_the_workers_and_deletion_forgets_everything(
        cluster: Cluster, dsn: str, postgres):
    _, admin = postgres
    role, database = f"rotated_{uuid.uuid4().hex[:8]}", f"rotated_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'rotated-pass'")
        conn.execute(f"CREATE DATABASE {database} OWNER {role}")
    rotated = psycopg.conninfo.make_conninfo(admin, user=role, password="rotated-pass", dbname=database)
    try:
        migrate(rotated)
        enqueue_sleeps(dsn, 60, 60)  # two ready tasks in the first database, five in the new one
        enqueue_sleeps(rotated, *[60] * 5)
        cluster.apply("rotor", worker_spec(maxReplicas=5, dryRun=True))  # dry run: no worker drains a queue
        cluster.wait_for(lambda: cluster.queueworker("rotor").get("status", {}).get("queueDepth", {}).get("ready") == 2,
                         timeout=30, message="depth from the first database")
        cluster.wait_for(lambda: controller_sessions(dsn) > 0, message="controller connected to the first database")
        before = cluster.apps.read_namespaced_deployment("rotor-worker", cluster.namespace)
        version = before.spec.template.metadata.annotations[SECRET_VERSION_ANNOTATION]

        cluster.secret(DB_SECRET, rotated)
        # The promise: the Secret is read again within SECRET_REFRESH_SECONDS, and the next tick reads the
        # depth and writes it; a loaded machine stretches the tick, never the refresh.
        cluster.wait_for(lambda: cluster.queueworker("rotor")["status"]["queueDepth"]["ready"] == 5,
                         timeout=SECRET_REFRESH_SECONDS + 30,
                         message="depth read from the new database, without restarting the controller")
        rolled = cluster.wait_for(lambda: (lambda d: d.spec.template.metadata.annotations[SECRET_VERSION_ANNOTATION]
                                           != version and d)(
            cluster.apps.read_namespaced_deployment("rotor-worker", cluster.namespace)), message="pods rolled")
        assert rolled.metadata.generation > before.metadata.generation
        cluster.wait_for(lambda: controller_sessions(dsn) == 0, timeout=15,
                         message="the first database's pool and listener closed")
        assert "queueworker_controller_databases 1.0" in cluster.metrics()

        cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "rotor")
        cluster.wait_for(lambda: controller_sessions(rotated) == 0, timeout=30,
                         message="the new database's connections closed after the deletion")
        metrics = cluster.metrics()
        assert "queueworker_controller_databases 0.0" in metrics
        assert 'name="rotor"' not in metrics, "a deleted QueueWorker's series are still exported"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {role}")

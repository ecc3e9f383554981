"""The test control plane itself: a real API server, real controllers, pods run as local processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.binaries import K8S_VERSION
from tests.cluster.controlplane import ControlPlane, ControlPlaneError
from tests.cluster.fixtures import require_binaries
from tests.cluster.kubelet import REPO_ROOT

pytestmark = pytest.mark.cluster

# A pod's process: records its pid at start and the SIGTERM it receives, then exits (or, with
# IGNORE_SIGTERM=1, carries on so only SIGKILL can end it).
SIGTERM_RECORDER = """
import os, signal, sys, time
marker = os.path.join(os.environ["MARKER_DIR"], os.environ["POD_NAME"])
def on_sigterm(signum, frame):
    open(marker + ".sigterm", "w").write(str(os.getpid()))
    if os.environ.get("IGNORE_SIGTERM") != "1":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_sigterm)
open(marker + ".started", "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def recorder_container(marker_dir: Path, ignore_sigterm: bool = False) -> dict:
    return {
        "name": "worker", "image": "queueworker:test",
        "command": ["python", "-c", SIGTERM_RECORDER],
        "env": [{"name": "MARKER_DIR", "value": str(marker_dir)},
                {"name": "IGNORE_SIGTERM", "value": "1" if ignore_sigterm else "0"}],
    }


def process_exists(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def pod_names(core: client.CoreV1Api, namespace: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace).items}


def test_api_server_serves_configmaps_and_validates_custom_resources(control_plane, cluster_namespace):
    api = control_plane.api_client()
    assert client.VersionApi(api).get_code().git_version == f"v{K8S_VERSION}"
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(cluster_namespace, {"metadata": {"name": "settings"}, "data": {"a": "1"}})
    assert core.read_namespaced_config_map("settings", cluster_namespace).data == {"a": "1"}

    crds = client.ApiextensionsV1Api(api)
    group = "widgets.test.queueworker.dev"
    crds.create_custom_resource_definition({
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                              "spec": {"type": "object", "required": ["replicas"], "properties": {
                                  "replicas": {"type": "integer", "minimum": 1}}},
                              "status": {"type": "object", "properties": {"ready": {"type": "integer"}}}}}}}],
        },
    })
    try:
        control_plane.wait_for(lambda: any(
            c.type == "Established" and c.status == "True"
            for c in crds.read_custom_resource_definition(f"widgets.{group}").status.conditions or []
        ), message="CRD Established")
        objects = client.CustomObjectsApi(api)
        widget = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "ok"},
                  "spec": {"replicas": 2}, "status": {"ready": 2}}
        created = control_plane.wait_for(  # discovery of the new type takes a moment
            lambda: objects.create_namespaced_custom_object(group, "v1", cluster_namespace, "widgets", widget))
        assert "status" not in created, "status is a subresource: the main endpoint must drop it"

        with pytest.raises(ApiException) as rejected:
            objects.create_namespaced_custom_object(group, "v1", cluster_namespace, "widgets", {
                **widget, "metadata": {"name": "bad"}, "spec": {"replicas": 0}})
        assert rejected.value.status == 422
        assert "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1" \
            in rejected.value.body
    finally:
        crds.delete_custom_resource_definition(f"widgets.{group}")


def test_deployment_pods_run_as_processes_and_get_sigterm_on_scale_down(control_plane, cluster_namespace, tmp_path):
    api = control_plane.api_client()
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    labels = {"app": "recorder"}
    apps.create_namespaced_deployment(cluster_namespace, {
        "metadata": {"name": "recorder"},
        "spec": {"replicas": 3, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"terminationGracePeriodSeconds": 10, "containers": [recorder_container(tmp_path)]}}},
    })
    control_plane.wait_for(lambda: apps.read_namespaced_deployment("recorder", cluster_namespace)
                           .status.available_replicas == 3, message="3 available replicas")
    started = control_plane.wait_for(lambda: len(files := list(tmp_path.glob("*.started"))) == 3 and files,
                                     message="3 processes started")
    pids = {f.name.removesuffix(".started"): int(f.read_text()) for f in started}
    assert set(pids) == pod_names(core, cluster_namespace)
    assert all(process_exists(pid) for pid in pids.values())
    for name in pids:
        pod = core.read_namespaced_pod(name, cluster_namespace)
        assert (pod.spec.node_name, pod.status.phase, pod.status.pod_ip) == ("process-kubelet", "Running", "127.0.0.1")

    apps.patch_namespaced_deployment_scale("recorder", cluster_namespace, {"spec": {"replicas": 1}})
    control_plane.wait_for(lambda: len(pod_names(core, cluster_namespace)) == 1, message="2 pods deleted")
    (survivor,) = pod_names(core, cluster_namespace)
    terminated = {f.name.removesuffix(".sigterm"): int(f.read_text()) for f in tmp_path.glob("*.sigterm")}
    assert terminated == {name: pid for name, pid in pids.items() if name != survivor}
    control_plane.wait_for(lambda: not any(process_exists(pid) for pid in terminated.values()),
                           message="terminated processes gone")
    assert process_exists(pids[survivor])


def test_sigkill_after_grace_period_when_sigterm_is_ignored(control_plane, cluster_namespace, tmp_path):
    core = client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_pod(cluster_namespace, {
        "metadata": {"name": "stubborn"},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [recorder_container(tmp_path, ignore_sigterm=True)]},
    })
    marker = tmp_path / "stubborn.started"
    control_plane.wait_for(marker.exists, message="process started")
    pid = int(marker.read_text())
    deleted_at = time.monotonic()
    core.delete_namespaced_pod("stubborn", cluster_namespace)
    control_plane.wait_for(lambda: "stubborn" not in pod_names(core, cluster_namespace), message="pod finalized")
    assert time.monotonic() - deleted_at >= 2, "the kubelet must wait out the grace period"
    assert (tmp_path / "stubborn.sigterm").exists()
    assert not process_exists(pid)


def test_pod_env_resolves_secrets_config_maps_and_fields(control_plane, cluster_namespace):
    core = client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_secret(cluster_namespace, {"metadata": {"name": "db"}, "stringData": {"dsn": "postgresql://x"}})
    core.create_namespaced_config_map(cluster_namespace, {"metadata": {"name": "tuning"}, "data": {"BATCH": "10"}})
    core.create_namespaced_pod(cluster_namespace, {
        "metadata": {"name": "env"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": "queueworker:test",
            "command": ["sh", "-c", "echo $POD_NAME/$POD_NAMESPACE $DSN $CFG_BATCH $NODE $GREETING"],
            "envFrom": [{"configMapRef": {"name": "tuning"}, "prefix": "CFG_"}],
            "env": [{"name": "DSN", "valueFrom": {"secretKeyRef": {"name": "db", "key": "dsn"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "GREETING", "value": "hello-$(NODE)"}],
        }]},
    })
    control_plane.wait_for(lambda: core.read_namespaced_pod("env", cluster_namespace).status.phase == "Succeeded",
                           message="pod Succeeded")
    assert control_plane.pod_log(cluster_namespace, "env").strip() == \
        f"env/{cluster_namespace} postgresql://x 10 process-kubelet hello-process-kubelet"


def test_deleting_an_owner_garbage_collects_what_it_owns(control_plane, cluster_namespace):
    core = client.CoreV1Api(control_plane.api_client())
    owner = core.create_namespaced_config_map(cluster_namespace, {"metadata": {"name": "owner"}})
    owner_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(cluster_namespace, {"metadata": {"name": "owned", "ownerReferences": [owner_ref]}})
    core.create_namespaced_secret(cluster_namespace, {"metadata": {"name": "owned", "ownerReferences": [owner_ref]}})
    core.delete_namespaced_config_map("owner", cluster_namespace)

    def gone(read) -> bool:
        try:
            read("owned", cluster_namespace)
        except ApiException as e:
            return e.status == 404
        return False

    control_plane.wait_for(lambda: gone(core.read_namespaced_config_map) and gone(core.read_namespaced_secret),
                           message="owned ConfigMap and Secret deleted")


def test_rbac_refuses_an_unbound_service_account_until_a_role_binding_grants_access(control_plane, cluster_namespace):
    admin = control_plane.api_client()
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    core.create_namespaced_service_account(cluster_namespace, {"metadata": {"name": "reader"}})
    token = core.create_namespaced_service_account_token(
        "reader", cluster_namespace, {"spec": {"expirationSeconds": 600}}).status.token
    configuration = client.Configuration()
    configuration.host = admin.configuration.host
    configuration.ssl_ca_cert = str(control_plane.pki_dir / "ca.crt")
    configuration.api_key = {"BearerToken": f"Bearer {token}"}
    as_reader = client.CoreV1Api(client.ApiClient(configuration))

    with pytest.raises(ApiException) as refused:
        as_reader.list_namespaced_config_map(cluster_namespace)
    assert refused.value.status == 403
    assert f"system:serviceaccount:{cluster_namespace}:reader" in refused.value.body

    rbac.create_namespaced_role(cluster_namespace, {"metadata": {"name": "read-configmaps"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]})
    rbac.create_namespaced_role_binding(cluster_namespace, {
        "metadata": {"name": "reader-reads-configmaps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": cluster_namespace}]})
    control_plane.wait_for(lambda: as_reader.list_namespaced_config_map(cluster_namespace) is not None,
                           message="access granted by the RoleBinding")
    with pytest.raises(ApiException) as still_refused:
        as_reader.create_namespaced_config_map(cluster_namespace, {"metadata": {"name": "nope"}})
    assert still_refused.value.status == 403


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_cli_start_and_stop_leave_no_process_or_port_behind(tmp_path):
    """`python -m tests.cluster start/stop` as a developer runs it, beside the session's control plane."""
    require_binaries()
    state_dir = tmp_path / "state"
    cli = [sys.executable, "-m", "tests.cluster"]
    subprocess.run([*cli, "start", "--state-dir", str(state_dir)], cwd=REPO_ROOT, check=True, timeout=120)
    plane = ControlPlane(state_dir)
    try:
        pids, ports = plane.running_pids(), plane.ports()
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kubelet"}
        assert all(listening(port) for port in ports.values())
        assert (state_dir / "kubeconfig").exists()
    finally:
        subprocess.run([*cli, "stop", "--state-dir", str(state_dir)], cwd=REPO_ROOT, check=True, timeout=60)
    assert not any(process_exists(pid) for pid in pids.values())
    assert not any(listening(port) for port in ports.values())


def test_start_fails_loudly_with_the_log_of_a_component_that_dies(tmp_path):
    bin_dir = require_binaries()
    broken = tmp_path / "bin"
    broken.mkdir()
    for name in ("kube-apiserver", "kube-controller-manager"):
        (broken / name).symlink_to(bin_dir / name)
    plane = ControlPlane(tmp_path / "state")
    with pytest.raises(ControlPlaneError, match="etcd is missing"):
        plane.start(broken)

    (broken / "etcd").write_text("#!/bin/sh\necho 'etcd: disk on fire' >&2\nexit 3\n")
    os.chmod(broken / "etcd", 0o755)
    with pytest.raises(ControlPlaneError, match=r"(?s)etcd exited with code 3.*etcd: disk on fire"):
        plane.start(broken)
    assert plane.running_pids() == {}

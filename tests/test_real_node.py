"""The real node: a kubelet on containerd and CNI, where pods are containers made from images.

What the process kubelet cannot show, shown here: images imported without a registry, SIGTERM and
SIGKILL through the runtime, security contexts and Pod Security admission enforced, memory limits in
the container's cgroup, pods reaching this machine (and a Postgres on it), and a stop, or the
cleanup after a crash, that leaves nothing on the host.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.cluster.binaries import BINARIES, K8S_VERSION
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fixtures import require_binaries
from tests.cluster.images import BUSYBOX_IMAGE, busybox_archive
from tests.cluster.kubelet import REPO_ROOT
from tests.cluster.node import NODE_NAME, REGISTRY_DIR, primary_ip

pytestmark = pytest.mark.cluster

# Compliant with Pod Security `restricted`, and what each field should do inside the container.
RESTRICTED_SECURITY = {
    "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}
# Prints `key=value` lines: who the process is, where it may write, its capabilities, no_new_privs and
# seccomp mode (2: filter), as the kernel reports them.
REPORT_PRIVILEGES = """
echo "uid=$(id -u)"; echo "gid=$(id -g)"
if touch /probe 2>/dev/null; then echo root_write=allowed; else echo root_write=denied; fi
if touch /tmp/probe; then echo tmp_write=allowed; else echo tmp_write=denied; fi
awk -F':[ \\t]*' '/^(CapEff|CapBnd|NoNewPrivs|Seccomp):/ {print $1 "=" $2}' /proc/self/status
"""


def busybox_pod(name: str, script: str, container: dict | None = None, **spec) -> dict:
    """A pod running `script` in busybox's sh. `imagePullPolicy: Never`: the image was imported, and
    nothing could be pulled anyway, so a missing image fails at once (ErrImageNeverPull)."""
    return {"metadata": {"name": name}, "spec": {"containers": [{
        "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", script],
        **(container or {})}], **spec}}


def wait_for_phase(plane: ControlPlane, namespace: str, name: str, *phases: str, timeout: float = 60):
    core = client.CoreV1Api(plane.api_client())
    return plane.wait_for(lambda: (pod := core.read_namespaced_pod(name, namespace)).status.phase in phases and pod,
                          timeout=timeout, message=f"pod {name} in {' or '.join(phases)}")


def pod_log(plane: ControlPlane, namespace: str, name: str) -> str:
    """The container's output as `kubectl logs` gets it: API server → kubelet → the log file."""
    return client.CoreV1Api(plane.api_client()).read_namespaced_pod_log(name, namespace)


def key_values(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def delete_and_watch_termination(plane: ControlPlane, namespace: str, name: str):
    """Delete the pod and follow it until it is gone: (seconds from the delete until its container
    was reported terminated, that terminated state)."""
    core = client.CoreV1Api(plane.api_client())
    version = core.read_namespaced_pod(name, namespace).metadata.resource_version
    deleted_at = time.monotonic()
    core.delete_namespaced_pod(name, namespace)
    terminated = None
    for event in watch.Watch().stream(core.list_namespaced_pod, namespace, field_selector=f"metadata.name={name}",
                                      resource_version=version, timeout_seconds=90):
        statuses = event["object"].status.container_statuses or []
        if terminated is None and statuses and statuses[0].state.terminated:
            terminated = (time.monotonic() - deleted_at, statuses[0].state.terminated)
        if event["type"] == "DELETED":
            break
    assert terminated is not None, f"pod {name} went away without reporting its container terminated"
    return terminated


# --- the node and its pods -------------------------------------------------------------------------

def test_node_is_ready_on_containerd_with_this_machines_address(real_node):
    node = client.CoreV1Api(real_node.api_client()).read_node(NODE_NAME)
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
    assert not node.spec.taints
    assert [(a.type, a.address) for a in node.status.addresses if a.type == "InternalIP"] == \
        [("InternalIP", primary_ip())]
    assert node.status.node_info.kubelet_version == f"v{K8S_VERSION}"
    assert node.status.node_info.container_runtime_version.startswith("containerd://1.")


def test_a_busybox_pod_runs_on_the_pod_network_and_its_logs_are_read_through_the_kubelet(
        real_node, real_node_namespace):
    core = client.CoreV1Api(real_node.api_client())
    core.create_namespaced_pod(real_node_namespace, busybox_pod(
        "hello", 'echo "hello from $(hostname)"', restartPolicy="Never"))
    pod = wait_for_phase(real_node, real_node_namespace, "hello", "Succeeded")
    assert pod.spec.node_name == NODE_NAME
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(real_node.pod_subnet)
    assert pod.status.container_statuses[0].container_id.startswith("containerd://")
    assert pod_log(real_node, real_node_namespace, "hello") == "hello from hello\n"


def test_sigterm_reaches_the_container_and_a_pod_that_traps_it_exits_cleanly(real_node, real_node_namespace):
    core = client.CoreV1Api(real_node.api_client())
    script = """trap 'echo "TERM received" > /dev/termination-log; exit 0' TERM
echo started; sleep 3600 & wait"""
    core.create_namespaced_pod(real_node_namespace, busybox_pod("trapper", script, terminationGracePeriodSeconds=30))
    wait_for_phase(real_node, real_node_namespace, "trapper", "Running")
    real_node.wait_for(lambda: pod_log(real_node, real_node_namespace, "trapper") == "started\n",
                       message="the trap set")
    _, terminated = delete_and_watch_termination(real_node, real_node_namespace, "trapper")
    # 0, not 137: the trap ran (a shell as PID 1 without one ignores SIGTERM, then SIGKILL ends it).
    assert (terminated.exit_code, terminated.message) == (0, "TERM received\n")


def test_a_pod_that_ignores_sigterm_is_killed_when_its_grace_period_is_over(real_node, real_node_namespace):
    core = client.CoreV1Api(real_node.api_client())
    grace = 3
    core.create_namespaced_pod(real_node_namespace, busybox_pod(
        "stubborn", "trap '' TERM; echo started; sleep 3600 & wait", terminationGracePeriodSeconds=grace))
    wait_for_phase(real_node, real_node_namespace, "stubborn", "Running")
    real_node.wait_for(lambda: pod_log(real_node, real_node_namespace, "stubborn") == "started\n",
                       message="the trap set")
    elapsed, terminated = delete_and_watch_termination(real_node, real_node_namespace, "stubborn")
    assert terminated.exit_code == 128 + signal.SIGKILL
    assert elapsed >= grace, f"killed after {elapsed:.1f}s, before its {grace}s grace period"


def test_a_restricted_namespace_runs_a_compliant_pod_with_its_security_context_enforced(
        real_node, real_node_namespace):
    core = client.CoreV1Api(real_node.api_client())
    core.patch_namespace(real_node_namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    core.create_namespaced_pod(real_node_namespace, busybox_pod(
        "confined", REPORT_PRIVILEGES,
        {"securityContext": RESTRICTED_SECURITY, "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]},
        restartPolicy="Never", volumes=[{"name": "tmp", "emptyDir": {}}]))
    wait_for_phase(real_node, real_node_namespace, "confined", "Succeeded")
    assert key_values(pod_log(real_node, real_node_namespace, "confined")) == {
        "uid": "65532", "gid": "65532", "root_write": "denied", "tmp_write": "allowed",
        "CapEff": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
    }


def test_a_restricted_namespace_refuses_pods_that_may_run_as_root(real_node, real_node_namespace):
    core = client.CoreV1Api(real_node.api_client())
    core.patch_namespace(real_node_namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    for name, security in (("root", {**RESTRICTED_SECURITY, "runAsNonRoot": False, "runAsUser": 0}),
                           ("default-user", {k: v for k, v in RESTRICTED_SECURITY.items()
                                             if k not in ("runAsNonRoot", "runAsUser")})):
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(real_node_namespace, busybox_pod(name, "id", {"securityContext": security}))
        message = json.loads(refused.value.body)["message"]
        assert refused.value.status == 403
        assert 'violates PodSecurity "restricted:latest"' in message
        assert "runAsNonRoot" in message or "runAsUser=0" in message, message


def test_a_memory_limit_is_the_containers_cgroup_limit_and_exceeding_it_is_an_oom_kill(
        real_node, real_node_namespace):
    """The container reads its cgroup's limit, then allocates past it. It waits a moment first:
    containerd's shim watches a container's cgroup for OOM events only once the task has started,
    and a process the kernel kills before that is reported as `Error` with the same exit code
    (containerd issue 8180, seen here once). The `sleep` keeps the kill after the watch."""
    core = client.CoreV1Api(real_node.api_client())
    limit = 32 * 1024 * 1024
    core.create_namespaced_pod(real_node_namespace, busybox_pod(
        "hungry", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes; sleep 2; "
                  "exec dd if=/dev/zero of=/dev/null bs=48M count=1",
        {"resources": {"limits": {"memory": f"{limit}"}}}, restartPolicy="Never"))
    pod = wait_for_phase(real_node, real_node_namespace, "hungry", "Failed")
    assert pod_log(real_node, real_node_namespace, "hungry").splitlines()[0] == str(limit)
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.reason, terminated.exit_code) == ("OOMKilled", 128 + signal.SIGKILL)


def test_an_image_loaded_from_a_docker_tag_runs_without_a_pull(real_node, real_node_namespace, tmp_path):
    """`load_image(TAG)`: `docker save TAG | ctr images import -`. The image is our busybox archive,
    loaded into Docker under a tag of its own (removed afterwards)."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("no Docker engine to save an image from")
    tag = f"queueworker.test/docker-loaded:{tmp_path.name.lower()}"
    subprocess.run(["docker", "load", "--input", str(busybox_archive())], capture_output=True, check=True)
    subprocess.run(["docker", "tag", BUSYBOX_IMAGE, tag], check=True)
    try:
        real_node.load_image(tag)
    finally:
        subprocess.run(["docker", "rmi", tag, BUSYBOX_IMAGE], capture_output=True)
    core = client.CoreV1Api(real_node.api_client())
    core.create_namespaced_pod(real_node_namespace, busybox_pod(
        "from-docker", "echo loaded", {"image": tag}, restartPolicy="Never"))
    wait_for_phase(real_node, real_node_namespace, "from-docker", "Succeeded")
    assert pod_log(real_node, real_node_namespace, "from-docker") == "loaded\n"


# --- networking ------------------------------------------------------------------------------------

def test_pods_reach_a_server_on_the_nodes_ip_from_their_own_address(real_node, real_node_namespace):
    core = client.CoreV1Api(real_node.api_client())
    with socket.create_server((real_node.node_ip, 0)) as server:
        server.settimeout(60)
        core.create_namespaced_pod(real_node_namespace, busybox_pod(
            "caller", f'echo "hello from $(hostname)" | nc "$HOST_IP" {server.getsockname()[1]}',
            {"env": [{"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]},
            restartPolicy="Never"))
        connection, (peer, _) = server.accept()
        with connection:
            assert connection.makefile().readline() == "hello from caller\n"
    assert ipaddress.ip_address(peer) in ipaddress.ip_network(real_node.pod_subnet), "pods are not masqueraded"


@pytest.mark.integration
def test_pods_reach_the_node_postgres_and_are_asked_for_a_password(real_node, real_node_namespace, node_postgres):
    """A startup message sent from a pod: the server answers with a SCRAM challenge ('R'), not with
    'no pg_hba.conf entry' ('E'), so it listens where pods connect and admits their subnet."""
    core = client.CoreV1Api(real_node.api_client())
    params = b"user\0postgres\0database\0postgres\0\0"
    startup = struct.pack("!ii", 8 + len(params), 3 << 16) + params  # protocol 3.0
    server = urlsplit(node_postgres.pod_dsn)
    core.create_namespaced_pod(real_node_namespace, busybox_pod(
        "pg-client", f'{{ printf "$STARTUP"; sleep 2; }} | nc {server.hostname} {server.port} | tr -cd "[:alnum:]-"',
        {"env": [{"name": "STARTUP", "value": "".join(f"\\{byte:03o}" for byte in startup)}]},
        restartPolicy="Never"))
    wait_for_phase(real_node, real_node_namespace, "pg-client", "Succeeded")
    answer = pod_log(real_node, real_node_namespace, "pg-client")
    assert answer.startswith("R") and "SCRAM-SHA-256" in answer, answer


def test_a_host_port_reaches_the_pod_through_portmap(real_node, real_node_namespace):
    core = client.CoreV1Api(real_node.api_client())
    with socket.socket() as probe:
        probe.bind((real_node.node_ip, 0))
        host_port = probe.getsockname()[1]
    core.create_namespaced_pod(real_node_namespace, busybox_pod(
        "listener", "while true; do echo served-by-pod | nc -l -p 8080; done",
        {"ports": [{"containerPort": 8080, "hostPort": host_port}]}))
    wait_for_phase(real_node, real_node_namespace, "listener", "Running")

    def served() -> str | None:
        try:
            with socket.create_connection((real_node.node_ip, host_port), timeout=5) as connection:
                return connection.makefile().readline()
        except OSError:  # refused until the pod listens
            return None

    assert real_node.wait_for(served, message="the host port answering") == "served-by-pod\n"


# --- stop and crash cleanup ------------------------------------------------------------------------

def host_traces(state_dir: Path, instance: str, chains: set[str] = frozenset(),
                shim_sockets: set[Path] = frozenset()) -> list[tuple[str, str]]:
    """(kind, what) of everything a node of `state_dir` (registry instance `instance`, which names its
    run dir, bridge, network and cgroups) may leave on this machine, read with the system's own tools
    rather than with the code under test; `chains` and `shim_sockets` are the node's own, seen while it
    ran (their names do not say whose they are)."""
    run_dir = str(REGISTRY_DIR / instance)
    traces = [("shim socket", str(path)) for path in shim_sockets if path.exists()]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(state_dir) in argv or run_dir in argv:
            traces.append(("process", f"{pid}: {argv.replace(chr(0), ' ')[:120]}"))
    traces += [("mount", point) for point in (line.split()[4] for line in
                                              Path("/proc/self/mountinfo").read_text().splitlines())
               if point.startswith((f"{state_dir}/", f"{run_dir}/"))]
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout)
    traces += [("interface", link["ifname"]) for link in links if instance in link["ifname"]]
    tables = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    traces += [("iptables", line) for line in tables.splitlines()
               if instance in line or any(line.startswith(f":{chain} ") for chain in chains)]
    traces += [("cgroup", str(path)) for path in Path("/sys/fs/cgroup").glob(f"*/queueworker-node-{instance}")]
    traces += [("cni cache", str(path)) for path in Path("/var/lib/cni/results").glob(f"*{instance}*")]
    traces += [("registry", str(path)) for path in REGISTRY_DIR.glob(f"{instance}*")]
    return traces


def portmap_chains(traces: list[tuple[str, str]]) -> set[str]:
    """The per-pod chains portmap's rules jump to."""
    return {rule.rsplit("-j ", 1)[1] for kind, rule in traces if kind == "iptables" and "-j CNI-DN-" in rule}


def shim_sockets(instance: str) -> set[Path]:
    """The shims' sockets, as containerd 1.6 records them in each task's bundle."""
    bundles = REGISTRY_DIR / instance / "containerd" / "io.containerd.runtime.v2.task" / "k8s.io"
    return {Path(f.read_text().removeprefix("unix://")) for f in bundles.glob("*/address")}


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.cluster", *args], cwd=REPO_ROOT, check=check, timeout=180)


def run_a_busy_pod(plane: ControlPlane) -> str:
    """A pod holding every kind of host resource: a sandbox (netns, veth on the bridge), a rootfs mount,
    a memory-backed volume, a host port (portmap's rules). Returns the node's instance."""
    namespace = plane.create_namespace()
    with socket.socket() as probe:
        probe.bind((plane.node_ip, 0))
        host_port = probe.getsockname()[1]
    client.CoreV1Api(plane.api_client()).create_namespaced_pod(namespace, busybox_pod(
        "busy", "sleep 3600", {"ports": [{"containerPort": 8080, "hostPort": host_port}],
                              "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]},
        volumes=[{"name": "scratch", "emptyDir": {"medium": "Memory"}}]))
    wait_for_phase(plane, namespace, "busy", "Running")
    return plane.node.record.instance


def test_stop_leaves_nothing_behind(tmp_path):
    require_binaries(BINARIES)
    cli("start", "--node", "--state-dir", str(tmp_path))
    plane = ControlPlane(tmp_path)
    try:
        instance = run_a_busy_pod(plane)
        sockets = shim_sockets(instance)
        traces = host_traces(plane.state_dir, instance, shim_sockets=sockets)
        assert {kind for kind, _ in traces} == {"process", "mount", "interface", "iptables", "cgroup", "cni cache",
                                                "registry", "shim socket"}, "the check must see a running node"
    finally:
        cli("stop", "--state-dir", str(tmp_path))
    assert host_traces(plane.state_dir, instance, portmap_chains(traces), sockets) == []


def test_the_next_start_cleans_up_after_crashed_runs(tmp_path):
    """Two ways a run crashes: its owner (a pytest session) is killed, its daemons keep running; or a
    node started from the command line loses its kubelet and containerd, its containers keep running."""
    bin_dir = require_binaries(BINARIES)
    owner = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from tests.cluster.controlplane import ControlPlane
ControlPlane({str(tmp_path / 'owned')!r}, node=True).start({str(bin_dir)!r})
print("ready", flush=True)
time.sleep(3600)
"""], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    assert owner.stdout.readline() == "ready\n"
    cli("start", "--node", "--state-dir", str(tmp_path / "handed-over"))
    crashed = [ControlPlane(tmp_path / "owned"), ControlPlane(tmp_path / "handed-over")]
    survivor = tmp_path / "next"
    try:
        seen = []
        for plane in crashed:
            instance = run_a_busy_pod(plane)
            sockets = shim_sockets(instance)
            seen.append((plane, instance, sockets, host_traces(plane.state_dir, instance, shim_sockets=sockets)))
        owner.kill()
        owner.wait()
        for name in ("kubelet", "containerd"):
            os.kill(crashed[1].running_pids()[name], signal.SIGKILL)

        cli("start", "--node", "--state-dir", str(survivor))
        for plane, instance, sockets, traces in seen:
            assert host_traces(plane.state_dir, instance, portmap_chains(traces), sockets) == []
            assert plane.running_pids() == {}, "a crashed run's control plane is stopped with its node"
    finally:
        owner.kill()
        for state_dir in (survivor, *(plane.state_dir for plane in crashed)):
            cli("stop", "--state-dir", str(state_dir), check=False)


def kube_proxy_chains() -> list[str]:
    return [line for family in ("iptables", "ip6tables")
            for line in subprocess.run([f"{family}-save"], capture_output=True, text=True, check=True).stdout.splitlines()
            if "KUBE-" in line]


def test_service_networking_reaches_services_by_name_and_stops_without_a_trace(tmp_path):
    """kube-proxy and the cluster DNS: a pod reaches another pod by its Service's name (DNS, then the
    ClusterIP's DNAT across the bridge) and the API server through the `kubernetes` Service; a second
    node with service networking is refused; stop removes kube-proxy's chains and frees port 53."""
    require_binaries(BINARIES)
    assert kube_proxy_chains() == [], "the check must start from a machine without kube-proxy's chains"
    cli("start", "--node", "--services", "--state-dir", str(tmp_path / "services"))
    plane = ControlPlane(tmp_path / "services")
    try:
        namespace = plane.create_namespace()
        core = client.CoreV1Api(plane.api_client())
        web = busybox_pod("web", "while true; do printf 'HTTP/1.0 200 OK\\r\\n\\r\\nserved-through-a-service' "
                                 "| nc -l -p 8080; done")
        web["metadata"]["labels"] = {"app": "web"}
        core.create_namespaced_pod(namespace, web)
        core.create_namespaced_service(namespace, {"metadata": {"name": "web"}, "spec": {
            "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
        wait_for_phase(plane, namespace, "web", "Running")
        core.create_namespaced_pod(namespace, busybox_pod("client", """
grep -E '^(nameserver|search)' /etc/resolv.conf
for i in 1 2 3 4 5 6 7 8 9 10; do echo GET | nc -w 5 web 80 && break; sleep 1; done
echo
nc -w 5 "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT" </dev/null && echo api=reached
""", restartPolicy="Never"))
        wait_for_phase(plane, namespace, "client", "Succeeded", "Failed")
        log = pod_log(plane, namespace, "client")
        assert f"nameserver {plane.node_ip}" in log and f"search {namespace}.svc.cluster.local" in log, log
        assert "served-through-a-service" in log, log
        assert "api=reached" in log and core.read_namespaced_service("kubernetes", "default").spec.cluster_ip == "10.0.0.1"

        second = subprocess.run([sys.executable, "-m", "tests.cluster", "start", "--node", "--services",
                                 "--state-dir", str(tmp_path / "second")], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=180)
        assert second.returncode == 1 and "only one node per machine" in second.stderr, second.stderr
        instance, node_ip = plane.node.record.instance, plane.node_ip
        assert kube_proxy_chains(), "the check must see kube-proxy's chains while the node runs"
    finally:
        cli("stop", "--state-dir", str(tmp_path / "services"))
    assert host_traces(plane.state_dir, instance) == []
    assert kube_proxy_chains() == []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as dns_port:
        dns_port.bind((node_ip, 53))  # the cluster DNS is gone

"""Start and stop the test cluster: etcd, kube-apiserver, kube-controller-manager, and either the
process kubelet or, in node mode, kube-scheduler, containerd and a real kubelet (node.py).

Each component runs as a background process in its own session (so it outlives `python -m tests.cluster
start` and can be stopped as a process group), logs to STATE_DIR/logs/NAME.log and records its pid in
STATE_DIR/pids/NAME.pid, which is all `stop` needs besides the node's registry entry. Ports are free
loopback ports; certificates come from a throwaway CA made at every start (pki.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Callable, TypeVar

from dnslib import DNSRecord
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from queueworker.dev.localpg import free_port

from . import images, pki
from .binaries import CONTROL_PLANE_BINARIES, NODE_BINARIES, BinariesUnavailable
from .kubelet import NODE_NAME as PROCESS_KUBELET_NODE, REPO_ROOT
from .node import NODE_NAME as REAL_NODE, NodeUnavailable, RealNode, check_host, ensure_host_packages, primary_ip

T = TypeVar("T")

# Start order; stop goes in reverse, so the services, then the kubelet (and the pods it runs), go first
# and etcd last. kube-scheduler and containerd run in node mode only, kube-proxy and the cluster DNS
# with service networking only.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd", "kubelet",
              "kube-proxy", "cluster-dns")
SERVICE_CIDR = "10.0.0.0/24"
# The `kubernetes` Service's ClusterIP (the first of SERVICE_CIDR) and names: pods reach the API server by them.
API_SERVICE_NAMES = ("10.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                     "kubernetes.default.svc.cluster.local")
# The controllers the tests rely on; node lifecycle is left out so the process kubelet's node is never tainted.
CONTROLLERS = (
    "deployment-controller", "replicaset-controller", "job-controller",
    "garbage-collector-controller", "namespace-controller", "serviceaccount-controller",
)
# For a real node: it comes up with the not-ready taint (TaintNodesByCondition admission), which the
# node lifecycle controller lifts; its pods mount the kube-root-ca.crt ConfigMap each namespace gets;
# kube-proxy and the cluster DNS find a Service's pods in its EndpointSlices.
NODE_CONTROLLERS = ("node-lifecycle-controller", "root-ca-certificate-publisher-controller",
                    "endpointslice-controller")
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
STOP_GRACE = 10.0
LOG_TAIL = 40


class ControlPlaneError(RuntimeError):
    """A component is missing, died or did not become ready; the message carries its last log lines."""


def _alive(pid: int) -> bool:
    """True for a running process; reaps it first if it is our exited child (zombies count as dead)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _is_pod_process(pid: int) -> bool:
    """A pid from a pod pid file still names a pod process: a session leader working in the repo root."""
    try:
        session = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
        return session == pid and Path(f"/proc/{pid}/cwd").resolve() == REPO_ROOT
    except (OSError, ValueError):
        return False


class ControlPlane:
    """The cluster in STATE_DIR. With `node=True` it runs a real node instead of the process kubelet, and
    with `services=True` as well the node's service networking: kube-proxy, a cluster DNS (dns.py) and an
    API server on the node's IP, which pods reach through the `kubernetes` Service as in any cluster (one
    such node per machine). A ControlPlane made for `stop` finds out by itself what was started there."""

    def __init__(self, state_dir: Path, node: bool = False, services: bool = False):
        self.state_dir = Path(state_dir).resolve()
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.log_dir = self.state_dir / "logs"
        self.pod_log_dir = self.state_dir / "pods"
        self.pid_dir = self.state_dir / "pids"
        self.pki_dir = self.state_dir / "pki"
        self.ports_file = self.state_dir / "ports.json"
        self.wants_node = node or services
        self.wants_services = services
        real_node = RealNode(self.state_dir)
        self.node = real_node if self.wants_node or real_node.record is not None else None

    @property
    def node_name(self) -> str:
        return REAL_NODE if self.node else PROCESS_KUBELET_NODE

    # --- helpers for tests -----------------------------------------------------------------------

    def api_client(self) -> client.ApiClient:
        """A client authenticated as the admin (group system:masters)."""
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def pod_log(self, namespace: str, name: str) -> str:
        """A process-kubelet pod's output (on a real node, read logs through the API)."""
        path = self.pod_log_dir / f"{namespace}_{name}.log"
        return path.read_text() if path.exists() else ""

    def _real_node(self) -> RealNode:
        if self.node is None:
            raise ControlPlaneError("this cluster runs the process kubelet: images and pod networking "
                                    "exist on a real node only (ControlPlane(..., node=True))")
        return self.node

    def load_image(self, image: str | os.PathLike) -> None:
        """Make an image available to the real node's pods: a local Docker tag or an archive path."""
        self._real_node().load_image(image)

    @property
    def node_ip(self) -> str:
        """The real node's InternalIP: this machine's primary address, by which pods reach it."""
        return self._real_node().node_ip

    @property
    def pod_subnet(self) -> str:
        """The real node's pod addresses (a /24 of 10.217.0.0/16): what a server must admit for pods."""
        return self._real_node().pod_subnet

    def ports(self) -> dict[str, int]:
        return json.loads(self.ports_file.read_text())

    @staticmethod
    def wait_for(condition: Callable[[], T], timeout: float = 30, interval: float = 0.2, message: str = "") -> T:
        """Poll until `condition()` returns something truthy and return it; API errors count as 'not yet'."""
        deadline, last_error = time.monotonic() + timeout, None
        while True:
            try:
                result = condition()
                if result:
                    return result
            except ApiException as e:
                last_error = e
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {message or condition}"
                                     + (f" (last error: {last_error})" if last_error else ""))
            time.sleep(interval)

    def create_namespace(self, prefix: str = "test") -> str:
        """A fresh namespace, returned once its `default` ServiceAccount exists (pods need it)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        core = client.CoreV1Api(self.api_client())
        core.create_namespace({"metadata": {"name": name}})
        self.wait_for(lambda: core.read_namespaced_service_account("default", name),
                      message=f"ServiceAccount {name}/default")
        return name

    # --- lifecycle ---------------------------------------------------------------------------------

    def running_pids(self) -> dict[str, int]:
        """Recorded components that are still alive and really ours (their command line names the state dir)."""
        pids = {}
        for name in COMPONENTS:
            path = self.pid_dir / f"{name}.pid"
            if not path.exists():
                continue
            pid = int(path.read_text())
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if str(self.state_dir).encode() in cmdline and _alive(pid):
                pids[name] = pid
        return pids

    def start(self, bin_dir: Path, timeout: float = 90) -> "ControlPlane":
        """Start every component and return once the API answers, `default` exists and the node is Ready
        (a real node also untainted, so pods schedule). A real node belongs to the calling process: if
        that dies without `stop`, the next node start cleans up after it (see `hand_over`)."""
        if self.running_pids():
            raise ControlPlaneError(f"a control plane is already running in {self.state_dir}; stop it first")
        if self.node is not None and self.node.record is not None:
            self.stop()  # what a crashed run left of its node in this state dir
        self.node = RealNode(self.state_dir) if self.wants_node else None
        needed = CONTROL_PLANE_BINARIES + (NODE_BINARIES if self.node else ())
        binaries = {b.name: Path(bin_dir) / b.name for b in needed}
        for path in binaries.values():
            if not os.access(path, os.X_OK):
                raise ControlPlaneError(f"{path} is missing; build it with `python -m tests.cluster build`")
        if self.node:
            self._prepare_node()
        for directory in (self.log_dir, self.pod_log_dir, self.pid_dir, self.pki_dir, self.state_dir / "etcd"):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
        self.state_dir.joinpath("etcd").chmod(0o700)
        ports = {"etcd": free_port(), "etcd-peer": free_port(), "kube-apiserver": free_port()}
        if self.node:
            ports.update({"kube-scheduler": free_port(), "kubelet": free_port()})
        if self.wants_services:
            ports.update({"kube-proxy-healthz": free_port(), "kube-proxy-metrics": free_port()})
        self.ports_file.write_text(json.dumps(ports))
        self._procs: dict[str, subprocess.Popen] = {}
        deadline = time.monotonic() + timeout
        if self.node:
            self.node.register(os.getpid(), primary_ip(),
                               binaries["kube-proxy"] if self.wants_services else None)
        # With service networking the API server listens on the node's IP, where pods can reach it.
        self.api_host = self.node.node_ip if self.wants_services else "127.0.0.1"
        server = f"https://{self.api_host}:{ports['kube-apiserver']}"
        try:
            ca = self._write_pki(server)
            self._start_etcd(binaries["etcd"], ports, deadline)
            self._start_apiserver(binaries["kube-apiserver"], ports, ca, deadline)
            core = client.CoreV1Api(self.api_client())
            self._wait_ready("namespace default", lambda: core.read_namespace("default"), deadline)
            self._spawn("kube-controller-manager", [
                str(binaries["kube-controller-manager"]),
                f"--kubeconfig={self.state_dir / 'controller-manager.kubeconfig'}",
                f"--controllers={','.join(CONTROLLERS + (NODE_CONTROLLERS if self.node else ()))}",
                "--leader-elect=false",
                "--secure-port=0",  # no health endpoint needed; readiness is judged by its effects
                *([f"--root-ca-file={self.pki_dir / 'ca.crt'}"] if self.node else []),
            ])
            self._wait_ready("the serviceaccount controller (ServiceAccount default/default)",
                             lambda: core.read_namespaced_service_account("default", "default"), deadline)
            if self.node:
                self._start_node(binaries, ports, ca, deadline)
            else:
                self._spawn("kubelet", [sys.executable, "-m", "tests.cluster.kubelet",
                                        f"--kubeconfig={self.kubeconfig}", f"--state-dir={self.state_dir}"])
            self._wait_ready(f"node {self.node_name} Ready", lambda: self._node_ready(core), deadline)
            if self.wants_services:
                self._start_services(ports, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def hand_over(self) -> None:
        """The starting process exits and leaves the cluster running (`python -m tests.cluster start`):
        its real node is then cleaned up by a later start only once its daemons are dead."""
        if self.node:
            self.node.hand_over()

    def _node_ready(self, core: client.CoreV1Api) -> bool:
        """Ready, and for a real node (which the scheduler places pods on) without the not-ready taint."""
        node = core.read_node(self.node_name)
        return (any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
                and not (self.node and any(t.key == NOT_READY_TAINT for t in node.spec.taints or [])))

    def _prepare_node(self) -> None:
        """What a real node needs before anything starts: the host, its packages and images, and no
        node of a crashed run holding on to processes, mounts or addresses."""
        check_host()
        ensure_host_packages()
        try:
            images.pause_archive()
            images.busybox_archive()
        except BinariesUnavailable as e:
            raise NodeUnavailable(f"the node's images cannot be made: {e}") from e
        for state_dir in self.node.stale_state_dirs():
            print(f"cleaning up the node of a crashed run in {state_dir}", file=sys.stderr)
            ControlPlane(state_dir).stop()

    def _start_node(self, binaries: dict[str, Path], ports: dict[str, int], ca: pki.KeyPair,
                    deadline: float) -> None:
        self._spawn("kube-scheduler", [
            str(binaries["kube-scheduler"]), f"--kubeconfig={self.state_dir / 'scheduler.kubeconfig'}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={ports['kube-scheduler']}",
            f"--tls-cert-file={self.pki_dir / 'scheduler.crt'}",
            f"--tls-private-key-file={self.pki_dir / 'scheduler.key'}",
        ])
        context = ssl.create_default_context(cadata=ca.cert_pem.decode())
        self._wait_ready("kube-scheduler /readyz", lambda: urllib.request.urlopen(
            f"https://127.0.0.1:{ports['kube-scheduler']}/readyz", context=context, timeout=5).status == 200, deadline)
        self.node.write_configs(binaries["cni/bridge"].parent)
        self._spawn("containerd", self.node.containerd_argv())
        self._wait_ready("containerd", self.node.containerd_ready, deadline)
        for archive in (images.pause_archive(), images.busybox_archive()):
            self.node.load_image(archive)
        self._spawn("kubelet", self.node.kubelet_argv(binaries["kubelet"], self.state_dir / "kubelet.kubeconfig",
                                                      ports["kubelet"], self.pki_dir))

    def _start_services(self, ports: dict[str, int], deadline: float) -> None:
        """kube-proxy, ready once it has written the Services' rules; the cluster DNS, ready once it
        answers for the `kubernetes` Service."""
        self.node.allow_forwarding()
        self._spawn("kube-proxy", self.node.kube_proxy_argv(self.state_dir / "kube-proxy.kubeconfig",
                                                            ports["kube-proxy-healthz"], ports["kube-proxy-metrics"]))
        self._wait_ready("kube-proxy /healthz", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{ports['kube-proxy-healthz']}/healthz", timeout=5).status == 200, deadline)
        self._spawn("cluster-dns", self.node.cluster_dns_argv(self.state_dir / "cluster-dns.kubeconfig"))
        question = DNSRecord.question(API_SERVICE_NAMES[-1])
        self._wait_ready("the cluster DNS", lambda: API_SERVICE_NAMES[0] in str(
            DNSRecord.parse(question.send(self.node.node_ip, 53, timeout=2))), deadline)

    def _write_pki(self, server: str) -> pki.KeyPair:
        ca = pki.CertificateAuthority()
        ca.pair.write(self.pki_dir, "ca")
        api_names = ("localhost", "127.0.0.1", *((self.node.node_ip, *API_SERVICE_NAMES) if self.node else ()))
        ca.serving(api_names).write(self.pki_dir, "apiserver")
        pki.service_account_signer().write(self.pki_dir, "service-account")
        pki.write_kubeconfig(self.kubeconfig, server, ca.pair, ca.client("queueworker-test-admin", ("system:masters",)))
        # The controller-manager has its own identity (visible in audit and managedFields) but full rights.
        pki.write_kubeconfig(self.state_dir / "controller-manager.kubeconfig", server, ca.pair,
                             ca.client("system:kube-controller-manager", ("system:masters",)))
        if self.node:
            # Identities the bootstrap RBAC rules and the Node authorizer know; the API server's client
            # certificate for kubelets (logs, exec) has full rights.
            pki.write_kubeconfig(self.state_dir / "scheduler.kubeconfig", server, ca.pair,
                                 ca.client("system:kube-scheduler"))
            ca.serving().write(self.pki_dir, "scheduler")
            pki.write_kubeconfig(self.state_dir / "kubelet.kubeconfig", server, ca.pair,
                                 ca.client(f"system:node:{REAL_NODE}", ("system:nodes",)))
            ca.serving((REAL_NODE, self.node.node_ip)).write(self.pki_dir, "kubelet")
            ca.client("kube-apiserver-kubelet-client", ("system:masters",)).write(self.pki_dir, "kubelet-client")
        if self.wants_services:
            pki.write_kubeconfig(self.state_dir / "kube-proxy.kubeconfig", server, ca.pair,
                                 ca.client("system:kube-proxy"))  # bound to system:node-proxier by bootstrap RBAC
            pki.write_kubeconfig(self.state_dir / "cluster-dns.kubeconfig", server, ca.pair,
                                 ca.client("queueworker-test-cluster-dns", ("system:masters",)))
        return ca.pair

    def _start_etcd(self, binary: Path, ports: dict[str, int], deadline: float) -> None:
        client_url, peer_url = f"http://127.0.0.1:{ports['etcd']}", f"http://127.0.0.1:{ports['etcd-peer']}"
        self._spawn("etcd", [
            str(binary), f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}", "--unsafe-no-fsync=true",
        ])
        self._wait_ready("etcd /health", lambda: json.loads(
            urllib.request.urlopen(f"{client_url}/health", timeout=2).read()).get("health") == "true", deadline)

    def _start_apiserver(self, binary: Path, ports: dict[str, int], ca: pki.KeyPair, deadline: float) -> None:
        port, pki_dir = ports["kube-apiserver"], self.pki_dir
        self._spawn("kube-apiserver", [
            str(binary),
            f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
            f"--bind-address={self.api_host}", f"--advertise-address={self.api_host}", f"--secure-port={port}",
            f"--tls-cert-file={pki_dir / 'apiserver.crt'}", f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
            f"--client-ca-file={pki_dir / 'ca.crt'}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            f"--service-account-issuer=https://{self.api_host}:{port}",
            f"--service-account-key-file={pki_dir / 'service-account.crt'}",
            f"--service-account-signing-key-file={pki_dir / 'service-account.key'}",
            *([f"--kubelet-client-certificate={pki_dir / 'kubelet-client.crt'}",
               f"--kubelet-client-key={pki_dir / 'kubelet-client.key'}",
               f"--kubelet-certificate-authority={pki_dir / 'ca.crt'}",
               "--kubelet-preferred-address-types=InternalIP"] if self.node else []),
        ])
        context = ssl.create_default_context(cadata=ca.cert_pem.decode())
        self._wait_ready("kube-apiserver /readyz", lambda: urllib.request.urlopen(
            f"https://{self.api_host}:{port}/readyz", context=context, timeout=5).status == 200, deadline)

    def _spawn(self, name: str, argv: list[str]) -> None:
        with (self.log_dir / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=REPO_ROOT, start_new_session=True)
        (self.pid_dir / f"{name}.pid").write_text(str(proc.pid))
        self._procs[name] = proc

    def log_tail(self, name: str, lines: int = LOG_TAIL) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return f"--- last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])

    def _wait_ready(self, what: str, check: Callable[[], object], deadline: float) -> None:
        last_error: Exception | None = None
        while True:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(f"{name} exited with code {proc.returncode} while waiting for "
                                            f"{what}\n{self.log_tail(name)}")
            try:
                if check():
                    return
            except Exception as e:  # noqa: BLE001 - anything short of a dead process means 'not yet'
                last_error = e
            if time.monotonic() > deadline:
                newest = list(self._procs)[-1]
                raise ControlPlaneError(f"timed out waiting for {what} (last error: {last_error})\n"
                                        f"{self.log_tail(newest)}")
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM each component's process group (kubelet first), SIGKILL after a grace period, then
        kill any pod processes a crashed kubelet left behind. A real node's containers are killed
        before containerd stops, and what they leave on the host is swept after everything stopped.
        Safe to call when nothing runs."""
        for name, pid in sorted(self.running_pids().items(), key=lambda kv: -COMPONENTS.index(kv[0])):
            if name == "containerd" and self.node:
                self.node.stop_containers()
            self._stop_group(pid, STOP_GRACE)
            (self.pid_dir / f"{name}.pid").unlink(missing_ok=True)
        if self.node:
            self.node.sweep()
        for pid_file in self.pod_log_dir.glob("*.pid"):
            pid = int(pid_file.read_text())
            if _is_pod_process(pid):
                self._stop_group(pid, 0)
            pid_file.unlink()

    @staticmethod
    def _stop_group(pid: int, grace: float) -> None:
        try:
            os.killpg(pid, signal.SIGTERM if grace else signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            os.killpg(pid, signal.SIGKILL)  # the leader is gone or late: nothing of the group may linger
        except ProcessLookupError:
            pass
        while _alive(pid):
            time.sleep(0.05)

"""The real node: a kubelet on Debian's containerd (CRI) and the CNI bridge, on this machine, as root.

Node mode of the test cluster (controlplane.py starts and stops the processes) for tests that need
what the process kubelet does not emulate: images, volumes, security contexts, resources, signals
through a container runtime, pod networking. Everything host-wide a node touches is named after
its instance (a hash of the state dir), so nodes of several clusters can run side by side:

- files: configuration, images and logs under STATE_DIR/node; sockets and runtime state (containerd's
  state, runc's root, network namespaces, the kubelet's root) in a run dir with a short path,
  /run/queueworker-cluster-nodes/<instance>, as socket paths must be short.
- containerd: a second instance beside any other (Docker's); its CRI plugin restricts oom_score_adj
  (runc cannot set -998 without CAP_SYS_RESOURCE), uses cgroupfs and our pause image.
- pods: cgroups under /queueworker-node-<instance> in every cgroup hierarchy; a bridge `qw-<instance>`
  and a /24 of 10.217.0.0/16, without masquerading: pods reach this machine's primary address,
  which is the node's IP, and nothing beyond it.
- /run/queueworker-cluster-nodes/<instance>.json records each running node (its owner, its subnet)
  so the next start cleans up after a run that crashed; host.json keeps the host settings the first
  node found (the kernel tunables the kubelet sets, the directories kubelet, shims and libcni create
  on demand, portmap's shared chains) so that the last node to stop restores them.

Stopping a node kills its containers through their cgroups, stops containerd, then sweeps what is
left (shims and their sockets, mounts, network namespaces, the bridge, portmap's iptables rules,
libcni's result cache, cgroups, the run dir), so a crashed run is cleaned up by the same code as a
clean one. What the node does not undo: net.ipv4.ip_forward=1, set by the bridge plugin for its
gateway, which Docker and every other container engine on the machine need as well.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from . import images

NODE_NAME = "queueworker-node"
POD_NETWORK_POOL = ipaddress.ip_network("10.217.0.0/16")  # not podman's 10.88/16 or Docker's 172.17/16
REGISTRY_DIR = Path("/run/queueworker-cluster-nodes")
# Commands the node needs, and the Debian packages that bring each (gcc compiles the pause image, as a
# static binary: libc6-dev, only recommended by gcc, holds the static libc).
HOST_PACKAGES = {"containerd": ("containerd",), "ctr": ("containerd",), "runc": ("runc",),
                 "iptables": ("iptables",), "gcc": ("gcc", "libc6-dev")}
# The kubelet sets these to its liking at start (kubelet/cm/container_manager_linux.go, setupKernelTunables).
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
# Created on demand, outside any state dir: by the kubelet (which no longer puts anything in it), for
# containerd's shim sockets (a fixed root in containerd 1.6), for libcni's result cache. Children first.
HOST_DIRS = ("/var/log/containers", "/run/containerd/s", "/run/containerd", "/var/lib/cni/results", "/var/lib/cni")
CNI_CACHE = Path("/var/lib/cni/results")
SHIM_SOCKETS = Path("/run/containerd/s")
# Every daemon of a cluster run; each names its state dir in its argv.
RUN_EXECUTABLES = ("containerd", "kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager",
                   "kube-apiserver", "etcd")
CLUSTER_DNS_MODULE = "tests.cluster.dns"  # the cluster DNS stand-in, a Python process (dns.py)
CLUSTER_DOMAIN = "cluster.local"
# portmap's chains in the nat table, shared by every CNI network that maps host ports.
HOSTPORT_CHAINS = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ")
KILL_TIMEOUT = 10.0


class NodeUnavailable(RuntimeError):
    """This machine cannot run a real node (not root, packages missing, no cgroups); the message says why."""


class ImageImportError(RuntimeError):
    """An image could not be put into the node (`docker save` or `ctr images import` failed)."""


def ensure_host_packages() -> None:
    """containerd, runc, iptables and gcc from Debian, installed when missing (as root, idempotently)."""
    missing = sorted({package for command, packages in HOST_PACKAGES.items() if shutil.which(command) is None
                      for package in packages})
    if not missing:
        return
    if os.geteuid() != 0:
        raise NodeUnavailable(f"the real node needs root to install {', '.join(missing)} (and to run)")
    if shutil.which("apt-get") is None:
        raise NodeUnavailable(f"{', '.join(missing)} missing and there is no apt-get to install them")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=600", *missing]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(install, capture_output=True, text=True, env=env)
    if done.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update", "-q", "-o", "DPkg::Lock::Timeout=600"], capture_output=True, env=env)
        done = subprocess.run(install, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise NodeUnavailable(f"`{' '.join(install)}` failed:\n{done.stderr.strip()[-2000:]}")


def check_host() -> None:
    """What the node needs of this machine besides packages: root and cgroups."""
    if os.geteuid() != 0:
        raise NodeUnavailable("the real node runs containers and configures networking: it needs root")
    if not cgroup_mounts():
        raise NodeUnavailable("no cgroup file system is mounted")


def primary_ip() -> str:
    """The source address of this machine's default route: the node's IP (the kubelet refuses loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3; no packet is sent, connect() only picks the route
        except OSError as e:
            raise NodeUnavailable(f"no IPv4 route to pick the node's IP from: {e}") from e
        return probe.getsockname()[0]


# --- the host as a whole ---------------------------------------------------------------------------

def _unescape(field: str) -> str:
    """/proc/self/mountinfo escapes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount in this mount namespace."""
    result = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, after = line.split(" - ", 1)
        result.append((_unescape(before.split()[4]), after.split()[0]))
    return result


def cgroup_mounts() -> list[Path]:
    return [Path(point) for point, fstype in mounts() if fstype in ("cgroup", "cgroup2")]


def _process_started(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), None if it is gone or a zombie. With the pid,
    it names one process: a pid reused later has another start time."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _iptables_rules(table: str = "nat", family: str = "iptables") -> tuple[set[str], list[str]]:
    """A table's chains and its `-A` lines, as iptables-save (or ip6tables-save) prints them."""
    chains, rules = set(), []
    for line in subprocess.run([f"{family}-save", "-t", table], capture_output=True, text=True, check=True
                               ).stdout.splitlines():
        if line.startswith(":"):
            chains.add(line[1:].split()[0])
        elif line.startswith("-A "):
            rules.append(line)
    return chains, rules


def _remove_iptables_rules(rules: list[str], chains: list[str], table: str = "nat", family: str = "iptables") -> None:
    """Delete the given `-A` lines, then flush and delete the chains, in one iptables-restore."""
    if not rules and not chains:
        return
    script = [f"*{table}", *("-D " + rule[3:] for rule in rules), *(f"-F {c}" for c in chains),
              *(f"-X {c}" for c in chains), "COMMIT", ""]
    subprocess.run([f"{family}-restore", "-w", "--noflush"], input="\n".join(script), text=True,
                   capture_output=True, check=True)


def _kube_proxy_chains() -> dict[tuple[str, str], tuple[set[str], list[str]]]:
    """kube-proxy's chains (KUBE-*) and every rule in or jumping to them, by (family, table)."""
    found = {}
    for family in ("iptables", "ip6tables"):
        if shutil.which(f"{family}-save") is None:
            continue
        for table in ("filter", "nat", "mangle"):
            chains, rules = _iptables_rules(table, family)
            ours = {c for c in chains if c.startswith("KUBE-")}
            if ours:
                found[family, table] = ours, [r for r in rules if r.split()[1] in ours
                                              or any(r.endswith(f"-j {c}") for c in ours)]
    return found


def instance_of(state_dir: Path) -> str:
    return hashlib.sha256(str(state_dir).encode()).hexdigest()[:10]


def run_dir_of(state_dir: Path) -> Path:
    """Where a node keeps its sockets and runtime state: a short path, as socket paths must be (108
    bytes), whatever the state dir's length."""
    return REGISTRY_DIR / instance_of(state_dir)


@dataclass
class NodeRecord:
    """What names a node's host-wide resources, kept in the registry so that cleaning up after a
    crashed run needs nothing else (its state dir may be gone)."""

    state_dir: str
    node_ip: str
    subnet: str
    owner_pid: int | None  # the process the node lives and dies with; None once `start` has handed it over
    owner_started: int | None
    # With service networking (kube-proxy and the cluster DNS), the kube-proxy binary, whose `--cleanup`
    # removes its host-wide iptables chains. One node per machine at a time may have it.
    kube_proxy: str | None = None

    @property
    def instance(self) -> str:
        return instance_of(Path(self.state_dir))

    @property
    def bridge(self) -> str:
        return f"qw-{self.instance}"  # interface names hold 15 characters

    @property
    def network(self) -> str:
        """The CNI network's name, which portmap writes into the comment of each of its iptables rules."""
        return f"queueworker-{self.instance}"

    @property
    def cgroup_root(self) -> str:
        return f"/queueworker-node-{self.instance}"

    @property
    def containerd_socket(self) -> str:
        return str(run_dir_of(Path(self.state_dir)) / "containerd.sock")

    def owner_alive(self) -> bool:
        return self.owner_pid is not None and _process_started(self.owner_pid) == self.owner_started

    def daemons_alive(self) -> bool:
        """Any of its containerd or kubelet still running (their argv names the state dir)."""
        return any(Path(argv[0]).name in ("containerd", "kubelet") and any(self.state_dir in a for a in argv)
                   for argv in map(_argv, _pids()) if argv and argv[0])

    def stale(self) -> bool:
        """Left by a run that crashed: its owner is gone, or, once handed over, its daemons are."""
        if self.owner_pid is not None:
            return not self.owner_alive()
        return not self.daemons_alive()


class Registry:
    """The running nodes of this machine, and the host settings to restore when the last one stops."""

    def __init__(self, directory: Path = REGISTRY_DIR):
        self.directory = directory
        self.host_file = directory / "host.json"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _path(self, record: NodeRecord) -> Path:
        return self.directory / f"{record.instance}.json"

    def records(self) -> list[NodeRecord]:
        if not self.directory.is_dir():
            return []
        return [NodeRecord(**json.loads(p.read_text())) for p in sorted(self.directory.glob("*.json"))
                if p != self.host_file]

    def find(self, state_dir: Path) -> NodeRecord | None:
        return next((r for r in self.records() if r.state_dir == str(state_dir)), None)

    def save(self, record: NodeRecord) -> None:
        """Register (or update) a node; the first one in records the host settings as it finds them."""
        if not self.records() and not self.host_file.exists():
            chains, _ = _iptables_rules() if shutil.which("iptables-save") else (set(), [])
            self.host_file.write_text(json.dumps({
                "tunables": {name: Path("/proc/sys", name).read_text().strip() for name in KERNEL_TUNABLES},
                "absent_dirs": [d for d in HOST_DIRS if not os.path.lexists(d)],
                "hostport_chains": sorted(chains & set(HOSTPORT_CHAINS)),
            }))
        self._path(record).write_text(json.dumps(asdict(record)))

    def remove(self, record: NodeRecord) -> None:
        """Unregister a node; the last one out puts the host settings back as the first one found them."""
        self._path(record).unlink(missing_ok=True)
        if self.records() or not self.host_file.exists():
            return
        host = json.loads(self.host_file.read_text())
        for name, value in host["tunables"].items():
            Path("/proc/sys", name).write_text(value)
        for directory in host["absent_dirs"]:
            with contextlib.suppress(OSError):  # not empty: someone else uses it now
                os.rmdir(directory)
        if shutil.which("iptables-save"):
            self._remove_hostport_chains(set(host["hostport_chains"]))
        self.host_file.unlink()

    @staticmethod
    def _remove_hostport_chains(existing_before: set[str]) -> None:
        """portmap's shared chains, if no node had them before and no other network's rules use them."""
        chains, rules = _iptables_rules()
        ours = [c for c in HOSTPORT_CHAINS if c in chains and c not in existing_before]
        if not ours or any(r.startswith("-A CNI-HOSTPORT-DNAT ") for r in rules):
            return
        _remove_iptables_rules([r for r in rules if any(r.endswith(f"-j {c}") for c in ours)], ours)

    def allocate_subnet(self) -> str:
        """The first /24 of the pool that no other node and no route of this machine uses."""
        taken = {ipaddress.ip_network(r.subnet) for r in self.records()}
        routes = subprocess.run(["ip", "-4", "-j", "route", "show", "table", "all"], capture_output=True,
                                text=True).stdout
        for route in json.loads(routes or "[]"):
            with contextlib.suppress(ValueError):
                if route.get("dst") not in (None, "default"):
                    taken.add(ipaddress.ip_network(route["dst"], strict=False))
        for subnet in POD_NETWORK_POOL.subnets(new_prefix=24):
            if not any(subnet.overlaps(t) for t in taken):
                return str(subnet)
        raise NodeUnavailable(f"every /24 of {POD_NETWORK_POOL} is in use")


# --- one node ---------------------------------------------------------------------------------------

class RealNode:
    """One node's files, host resources and lifecycle steps; controlplane.py runs its processes."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir).resolve()
        self.registry = Registry()
        # Configuration, images and logs under the state dir; sockets and runtime state in the run dir.
        self.dir = self.state_dir / "node"
        self.run_dir = run_dir_of(self.state_dir)
        self.containerd_dir = self.dir / "containerd"
        self.containerd_config = self.containerd_dir / "config.toml"
        self.cni_dir = self.dir / "cni"
        self.kubelet_dir = self.dir / "kubelet"
        self.kubelet_config = self.kubelet_dir / "config.json"
        self.pod_log_dir = self.kubelet_dir / "pod-logs"
        self.record = self.registry.find(self.state_dir)

    @property
    def socket(self) -> str:
        return str(self.run_dir / "containerd.sock")

    @property
    def pod_subnet(self) -> str:
        return self.record.subnet

    @property
    def node_ip(self) -> str:
        return self.record.node_ip

    def _ctr(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ctr", "--address", self.socket, "--namespace", "k8s.io", *args],
                              capture_output=True, **kwargs)

    # --- start --------------------------------------------------------------------------------------

    def stale_state_dirs(self) -> list[Path]:
        """State dirs of nodes left by crashed runs; the caller stops them (processes first)."""
        with self.registry.locked():
            return [Path(r.state_dir) for r in self.registry.records() if r.stale()]

    def register(self, owner_pid: int, node_ip: str, kube_proxy: Path | None = None) -> None:
        """Claim a subnet and the instance's names, record the host settings if first, set up cgroups.
        With `kube_proxy`, the node runs service networking, which only one node of a machine can: kube-proxy's
        chains and the DNS port are host-wide."""
        with self.registry.locked():
            if self.registry.find(self.state_dir) is not None:
                raise NodeUnavailable(f"a node is already registered for {self.state_dir}; stop it first")
            if kube_proxy is not None and (other := next(
                    (r for r in self.registry.records() if r.kube_proxy and not r.stale()), None)):
                raise NodeUnavailable(f"the node in {other.state_dir} runs service networking (kube-proxy, DNS on "
                                      f"port 53), which only one node per machine can; stop it first")
            if kube_proxy is not None and (chains := _kube_proxy_chains()):
                raise NodeUnavailable(f"this machine already has kube-proxy's iptables chains ({sorted(chains)}): "
                                      "another Kubernetes node runs here, and its service networking is not ours "
                                      "to take over or remove")
            self.record = NodeRecord(str(self.state_dir), node_ip, self.registry.allocate_subnet(), owner_pid,
                                     _process_started(owner_pid), str(kube_proxy) if kube_proxy else None)
            self.registry.save(self.record)
        self.run_dir.mkdir(exist_ok=True)
        for hierarchy in cgroup_mounts():
            root = hierarchy / self.record.cgroup_root.lstrip("/")
            root.mkdir(exist_ok=True)
            for setting in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset group is unusable until set
                if (hierarchy / setting).exists():
                    (root / setting).write_text((hierarchy / setting).read_text())

    def hand_over(self) -> None:
        """The starting process is about to exit (`python -m tests.cluster start`): from now on the node
        counts as crashed only when its daemons are gone."""
        with self.registry.locked():
            self.record.owner_pid = self.record.owner_started = None
            self.registry.save(self.record)

    def write_configs(self, cni_bin_dir: Path) -> None:
        for directory in (self.containerd_dir, self.cni_dir / "net.d", self.kubelet_dir, self.pod_log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        (self.cni_dir / "net.d" / "10-pods.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": self.record.network, "plugins": [
                {"type": "bridge", "bridge": self.record.bridge, "isGateway": True, "ipMasq": False,
                 "hairpinMode": True, "ipam": {
                     "type": "host-local", "ranges": [[{"subnet": self.record.subnet}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.cni_dir / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ]}, indent=2))
        toml = lambda value: json.dumps(str(value))  # noqa: E731 - a TOML basic string, for paths and names
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        self.containerd_config.write_text("\n".join([
            "version = 2",
            f"root = {toml(self.containerd_dir / 'root')}",
            f"state = {toml(self.run_dir / 'containerd')}",
            "[grpc]", f"  address = {toml(self.socket)}",
            '[plugins."io.containerd.internal.v1.opt"]', f"  path = {toml(self.containerd_dir / 'opt')}",
            f"{cri}]",
            f"  sandbox_image = {toml(images.PAUSE_IMAGE)}",
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",
            f"{cri}.containerd.runtimes.runc]", '  runtime_type = "io.containerd.runc.v2"',
            f"{cri}.containerd.runtimes.runc.options]",
            "  SystemdCgroup = false", f"  Root = {toml(self.run_dir / 'runc')}",
            f"{cri}.cni]", f"  bin_dir = {toml(cni_bin_dir)}", f"  conf_dir = {toml(self.cni_dir / 'net.d')}",
            "",
        ]))

    def allow_forwarding(self) -> None:
        """Accept what is routed to and from the pods' bridge (pod to pod through a Service's DNAT, which
        br_netfilter hands to the FORWARD chain): another container engine on the machine (Docker) may
        have set that chain's policy to DROP. The rules carry the network's name, which sweep looks for."""
        for direction in ("-o", "-i"):
            subprocess.run(["iptables", "-w", "-I", "FORWARD", "1", direction, self.record.bridge, "-m", "comment",
                            "--comment", self.record.network, "-j", "ACCEPT"], capture_output=True, check=True)

    def kube_proxy_argv(self, kubeconfig: Path, healthz_port: int, metrics_port: int) -> list[str]:
        """kube-proxy in iptables mode, for this node's pods, touching no kernel setting it can leave alone
        (conntrack limits and timeouts, route_localnet for localhost node ports)."""
        config_file = self.dir / "kube-proxy.json"
        config_file.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables", "clusterCIDR": self.record.subnet, "hostnameOverride": NODE_NAME,
            "bindAddress": self.node_ip, "nodePortAddresses": [f"{self.node_ip}/32"],
            "healthzBindAddress": f"127.0.0.1:{healthz_port}", "metricsBindAddress": f"127.0.0.1:{metrics_port}",
            "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }, indent=2))
        return [self.record.kube_proxy, f"--config={config_file}", "--v=1"]

    def cluster_dns_argv(self, kubeconfig: Path) -> list[str]:
        return [sys.executable, "-m", CLUSTER_DNS_MODULE, f"--kubeconfig={kubeconfig}", f"--address={self.node_ip}",
                f"--state-dir={self.state_dir}"]

    def containerd_argv(self) -> list[str]:
        return [shutil.which("containerd") or "containerd", f"--config={self.containerd_config}"]

    def containerd_ready(self) -> bool:
        return os.path.exists(self.socket) and self._ctr("version").returncode == 0

    def load_image(self, image: str | os.PathLike) -> None:
        """Import an image into the node, where pods find it without pulling (nothing can be pulled here):
        an archive (`docker save`'s or OCI's format) by path, or a local Docker image by tag, through
        `docker save TAG | ctr images import -`. Pods must not ask for a pull: no `:latest` tag (or
        `imagePullPolicy: IfNotPresent`/`Never`)."""
        if isinstance(image, os.PathLike) or os.path.isfile(image):
            done = self._ctr("images", "import", os.fspath(image), text=True)
        else:
            save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            done = self._ctr("images", "import", "-", stdin=save.stdout, text=True)
            save.stdout.close()
            if save.wait() != 0:
                raise ImageImportError(f"docker save {image} failed: {save.stderr.read().decode().strip()}")
        if done.returncode != 0:
            raise ImageImportError(f"importing {image} into the node failed: {done.stderr.strip()}")

    def kubelet_config_json(self, port: int, pki_dir: Path) -> dict:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # This machine's facts: cgroup v1 (refused by default since 1.35), no systemd, swap allowed.
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "failSwapOn": False,
            "cgroupRoot": self.record.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": self.node_ip, "port": port, "readOnlyPort": 0, "healthzPort": 0,
            "tlsCertFile": str(pki_dir / "kubelet.crt"), "tlsPrivateKeyFile": str(pki_dir / "kubelet.key"),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki_dir / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.pod_log_dir),
            **({"clusterDNS": [self.node_ip], "clusterDomain": CLUSTER_DOMAIN} if self.record.kube_proxy else {}),
            "makeIPTablesUtilChains": False,  # the host's iptables stay as they are
            # Imported images cannot be pulled again: never collect them. Evict only near exhaustion.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        }

    def kubelet_argv(self, binary: Path, kubeconfig: Path, port: int, pki_dir: Path) -> list[str]:
        self.kubelet_config.write_text(json.dumps(self.kubelet_config_json(port, pki_dir), indent=2))
        return [str(binary), f"--config={self.kubelet_config}", f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.run_dir / 'kubelet'}", f"--hostname-override={NODE_NAME}",
                f"--node-ip={self.node_ip}", "--v=1"]

    # --- stop ---------------------------------------------------------------------------------------

    def _cgroups(self) -> list[Path]:
        """Our cgroup tree in every hierarchy, children before parents."""
        found = []
        for hierarchy in cgroup_mounts():
            root = hierarchy / self.record.cgroup_root.lstrip("/")
            if root.is_dir():
                found += [Path(d) for d, _, _ in os.walk(root, topdown=False)]
        return found

    def _cgroup_pids(self) -> set[int]:
        pids = set()
        for group in self._cgroups():
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile by the kubelet or runc
                pids.update(int(p) for p in (group / "cgroup.procs").read_text().split())
        return pids

    def _kill_containers(self) -> None:
        """SIGKILL every process in the node's cgroups (containers and their sandboxes) until none is left."""
        deadline = time.monotonic() + KILL_TIMEOUT
        while pids := self._cgroup_pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {sorted(pids)} survive SIGKILL in {self.record.cgroup_root}")
            time.sleep(0.1)

    def stop_containers(self) -> None:
        """Kill the containers while containerd still runs, so it reaps their tasks and their shims exit
        cleanly (removing their sockets); the sweep kills what is left after KILL_TIMEOUT."""
        self._kill_containers()
        deadline = time.monotonic() + KILL_TIMEOUT
        while self._shims() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _shims(self) -> list[int]:
        return [pid for pid in _pids() if (argv := _argv(pid)) and Path(argv[0]).name.startswith("containerd-shim")
                and self.record.containerd_socket in argv]

    def _processes(self) -> list[int]:
        """Shims and daemons of this run still running: a crashed run's, found even when its pid files
        went with its state dir."""
        return self._shims() + [pid for pid in _pids() if (argv := _argv(pid))
                                and (Path(argv[0]).name in RUN_EXECUTABLES or CLUSTER_DNS_MODULE in argv)
                                and any(self.record.state_dir in a for a in argv)]

    def sweep(self) -> None:
        """Remove everything the node left on the host, then unregister it. Safe to repeat."""
        if self.record is None:
            return
        self._kill_containers()
        shim_sockets = self._shim_sockets()
        deadline = time.monotonic() + KILL_TIMEOUT
        while processes := self._processes():
            for pid in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {processes} of the node in {self.state_dir} survive SIGKILL")
            time.sleep(0.1)
        self._unmount_all()
        for path in shim_sockets:
            path.unlink(missing_ok=True)
        subprocess.run(["ip", "link", "delete", self.record.bridge], capture_output=True)
        if shutil.which("iptables-save"):
            self._remove_portmap_rules()
            self._remove_forward_rules()
        if self.record.kube_proxy:
            self._remove_kube_proxy_rules()
        self._remove_cni_cache()
        for group in self._cgroups():
            group.rmdir()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.containerd_dir / "root", ignore_errors=True)  # images and snapshots: disk, not logs
        with self.registry.locked():
            self.registry.remove(self.record)

    def _shim_sockets(self) -> list[Path]:
        """containerd 1.6 puts each shim's socket under /run/containerd/s and writes its address into
        the task's bundle; a shim that dies without a clean shutdown leaves it there."""
        bundles = self.run_dir / "containerd" / "io.containerd.runtime.v2.task"
        return [SHIM_SOCKETS / Path(address.read_text().strip().removeprefix("unix://")).name
                for address in bundles.glob("*/*/address")]

    def _remove_cni_cache(self) -> None:
        """libcni's cached results of our sandboxes: for our network, `NETWORK-SANDBOX-eth0`, and for the
        loopback network containerd adds to each sandbox, `cni-loopback-SANDBOX-lo`."""
        for entry in CNI_CACHE.glob(f"{self.record.network}-*"):
            sandbox = entry.name.removeprefix(f"{self.record.network}-").rsplit("-", 1)[0]
            (CNI_CACHE / f"cni-loopback-{sandbox}-lo").unlink(missing_ok=True)
            entry.unlink()

    def _unmount_all(self) -> None:
        """Detach every mount under the state and run dirs, deepest first: kubelet volumes and its root's
        bind mount, container rootfs, sandbox shm, network namespaces (freeing them frees their veths)."""
        libc = ctypes.CDLL(None, use_errno=True)
        prefixes = (f"{self.state_dir}/", f"{self.run_dir}/")
        while points := sorted({p for p, _ in mounts() if p.startswith(prefixes)}, key=len, reverse=True):
            for point in points:
                if libc.umount2(point.encode(), 2) != 0:  # MNT_DETACH
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"umount {point}: {os.strerror(errno)}")

    def _remove_portmap_rules(self) -> None:
        """portmap's rules for this node's pods (their comment names our network) and the per-pod chains
        they jump to; the shared chains go when the last node stops (Registry.remove)."""
        _, rules = _iptables_rules()
        ours = [r for r in rules if f'name: \\"{self.record.network}\\"' in r]
        jumps = sorted({r.rsplit("-j ", 1)[1] for r in ours if r.rsplit("-j ", 1)[1].startswith("CNI-DN-")})
        _remove_iptables_rules([r for r in ours if r.split()[1] not in jumps], jumps)

    def _remove_forward_rules(self) -> None:
        _, rules = _iptables_rules("filter")
        _remove_iptables_rules([r for r in rules if f"--comment {self.record.network} " in r], [], "filter")

    def _remove_kube_proxy_rules(self) -> None:
        """`kube-proxy --cleanup`, then what it leaves (its KUBE-FIREWALL chains): no other node had any
        KUBE-* chain when this one started (register refuses then)."""
        if os.access(self.record.kube_proxy, os.X_OK):
            subprocess.run([self.record.kube_proxy, "--cleanup"], capture_output=True)
        for (family, table), (chains, rules) in _kube_proxy_chains().items():
            _remove_iptables_rules([r for r in rules if r.split()[1] not in chains], sorted(chains), table, family)

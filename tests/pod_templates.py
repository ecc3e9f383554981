"""QueueWorker `template`s a tenant may and may not use, shared by the controller's own check
(tests/test_controller_podsecurity.py) and the CRD's CEL rules against the API server
(tests/test_controller_cluster.py, tests/test_controller_cluster_safety.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Refused:
    id: str
    template: dict[str, Any]
    path: str  # where the controller reports it (podsecurity.violations) ...
    api_path: str  # ... and where the API server does (relative to spec.template)
    cel: bool = True  # False: the CRD schema does not see it, only the controller refuses it


def _worker(**security: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "worker", "securityContext": security}]}}


def _pod(**security: Any) -> dict[str, Any]:
    return {"spec": {"securityContext": security}}


REFUSED = [
    Refused("privileged", _worker(privileged=True), "spec.containers[worker].securityContext.privileged",
            "spec.containers[0].securityContext.privileged"),
    Refused("privileged-sidecar", {"spec": {"containers": [
        {"name": "sidecar", "image": "busybox", "securityContext": {"privileged": True}}]}},
        "spec.containers[sidecar].securityContext.privileged", "spec.containers[0].securityContext.privileged"),
    Refused("privileged-init", {"spec": {"initContainers": [
        {"name": "setup", "image": "busybox", "securityContext": {"privileged": True}}]}},
        "spec.initContainers[setup].securityContext.privileged", "spec.initContainers[0].securityContext.privileged"),
    Refused("privileged-ephemeral", {"spec": {"ephemeralContainers": [
        {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}}]}},
        "spec.ephemeralContainers[debug].securityContext.privileged",
        "spec.ephemeralContainers[0].securityContext.privileged"),
    Refused("capability-sys-admin", _worker(capabilities={"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}),
            "spec.containers[worker].securityContext.capabilities.add",
            "spec.containers[0].securityContext.capabilities.add[1]"),
    Refused("host-network", {"spec": {"hostNetwork": True}}, "spec.hostNetwork", "spec.hostNetwork"),
    Refused("host-pid", {"spec": {"hostPID": True}}, "spec.hostPID", "spec.hostPID"),
    Refused("host-ipc", {"spec": {"hostIPC": True}}, "spec.hostIPC", "spec.hostIPC"),
    Refused("host-path", {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
            "spec.volumes[root]", "spec.volumes[0].hostPath"),
    Refused("nfs-volume", {"spec": {"volumes": [{"name": "share", "nfs": {"server": "nfs", "path": "/"}}]}},
            "spec.volumes[share]", "spec.volumes[0].nfs"),
    Refused("unknown-volume-source", {"spec": {"volumes": [{"name": "odd", "futureSource": {"path": "/"}}]}},
            "spec.volumes[odd]", "", cel=False),
    Refused("privilege-escalation", _worker(allowPrivilegeEscalation=True),
            "spec.containers[worker].securityContext.allowPrivilegeEscalation",
            "spec.containers[0].securityContext.allowPrivilegeEscalation"),
    Refused("root-pod", _pod(runAsUser=0), "spec.securityContext.runAsUser", "spec.securityContext.runAsUser"),
    Refused("root-container", _worker(runAsUser=0), "spec.containers[worker].securityContext.runAsUser",
            "spec.containers[0].securityContext.runAsUser"),
    Refused("run-as-non-root-false", _pod(runAsNonRoot=False), "spec.securityContext.runAsNonRoot",
            "spec.securityContext.runAsNonRoot"),
    Refused("proc-mount", _worker(procMount="Unmasked"), "spec.containers[worker].securityContext.procMount",
            "spec.containers[0].securityContext.procMount"),
    Refused("seccomp-unconfined", _pod(seccompProfile={"type": "Unconfined"}),
            "spec.securityContext.seccompProfile.type", "spec.securityContext.seccompProfile.type"),
    Refused("apparmor-unconfined", _worker(appArmorProfile={"type": "Unconfined"}),
            "spec.containers[worker].securityContext.appArmorProfile.type",
            "spec.containers[0].securityContext.appArmorProfile.type"),
    Refused("apparmor-annotation", {"metadata": {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/worker": "unconfined"}}},
        "metadata.annotations[container.apparmor.security.beta.kubernetes.io/worker]", "metadata.annotations"),
    Refused("unsafe-sysctl", _pod(sysctls=[{"name": "kernel.msgmax", "value": "65536"}]),
            "spec.securityContext.sysctls", "spec.securityContext.sysctls[0].name"),
    Refused("windows-host-process", _pod(windowsOptions={"hostProcess": True}),
            "spec.securityContext.windowsOptions.hostProcess", "spec.securityContext.windowsOptions.hostProcess"),
    Refused("selinux-spc", _worker(seLinuxOptions={"type": "spc_t"}),
            "spec.containers[worker].securityContext.seLinuxOptions",
            "spec.containers[0].securityContext.seLinuxOptions"),
    Refused("host-port", {"spec": {"containers": [{"name": "worker", "ports": [
        {"name": "metrics", "containerPort": 9100, "hostPort": 9100}]}]}},
        "spec.containers[worker].ports", "spec.containers[0].ports[0].hostPort"),
    Refused("probe-other-host", {"spec": {"containers": [{"name": "worker", "livenessProbe": {
        "httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}}}]}},
        "spec.containers[worker].livenessProbe.httpGet.host", "", cel=False),
]

# Templates that must stay usable: what workers legitimately need, including the restricted
# profile's own allowances.
ALLOWED = {
    "resources-and-scheduling": {"spec": {"nodeSelector": {"pool": "workers"}, "containers": [
        {"name": "worker", "resources": {"limits": {"memory": "1Gi"}}}]}},
    "restricted-sidecar": {"spec": {"containers": [{"name": "proxy", "image": "proxy:1", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]}},
    "own-user-and-profiles": {"spec": {"securityContext": {
        "runAsUser": 2000, "runAsNonRoot": True, "seccompProfile": {"type": "Localhost", "localhostProfile": "w.json"},
        "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]}}},
    "restricted-volumes": {"spec": {"volumes": [{"name": "config", "configMap": {"name": "app"}},
                                                {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}]}},
    "token-and-annotations": {"metadata": {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/worker": "runtime/default"}},
        "spec": {"automountServiceAccountToken": True, "serviceAccountName": "worker"}},
}

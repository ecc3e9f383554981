"""What a worker pod may not ask for: the privilege checks of the Pod Security "baseline" and
"restricted" profiles, applied to the pod template the controller is about to deploy.

Creating a QueueWorker makes the controller create a Deployment with the controller's identity.
Without this check anyone allowed to create QueueWorkers in a namespace would get whatever pod
the `template` describes (privileged, on the host's network, with the node's filesystem mounted)
even where they may not create such pods themselves. The CRD refuses most of this at admission
(CEL rules in crds/); this module is the controller's own check on the *merged* pod template, so
it also covers what CEL cannot see: volume sources the schema does not name, host fields in
probes and lifecycle handlers, objects stored before the rules existed, and a CRD installed
without them. A cluster opts out with `--allow-privileged-templates`.

The lists follow k8s.io/pod-security-admission v0.35 (policy/check_*.go).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Volume sources the restricted profile allows; every other source (hostPath first) is refused.
ALLOWED_VOLUME_SOURCES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                                    "persistentVolumeClaim", "projected", "secret"})
ALLOWED_ADDED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
})
ALLOWED_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
ALLOWED_PROC_MOUNTS = frozenset({"Default"})
UNCONFINED = "Unconfined"
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
APPARMOR_UNCONFINED_ANNOTATION = "unconfined"
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
LIFECYCLE_HOOKS = ("postStart", "preStop")


def violations(pod_template: Any) -> list[str]:
    """Every reason this pod template may not be deployed, as `path: what is wrong`; [] when none.

    Never raises: a template of the wrong shape is reported, not trusted."""
    found = _shape(pod_template)
    if found:
        return found  # what cannot be read cannot be vouched for
    annotations = (pod_template.get("metadata") or {}).get("annotations") or {}
    for key, value in annotations.items():
        if str(key).startswith(APPARMOR_ANNOTATION_PREFIX) and value == APPARMOR_UNCONFINED_ANNOTATION:
            found.append(f"metadata.annotations[{key}]: AppArmor may not be unconfined")
    spec = pod_template.get("spec") or {}
    for field in HOST_NAMESPACES:
        if spec.get(field) is True:
            found.append(f"spec.{field}: host namespaces are not allowed")
    found += _security_context(spec.get("securityContext") or {}, "spec.securityContext", pod_level=True)
    for volume in spec.get("volumes") or []:
        found += _volume(volume)
    for path, container in _containers(spec):
        found += _container(container, path)
    return found


def _shape(pod_template: Any) -> list[str]:
    """The parts this check reads must have the shape a pod template gives them."""
    if not isinstance(pod_template, dict):
        return ["template: must be an object"]
    wrong = [f"{part}: must be an object" for part in ("metadata", "spec")
             if not isinstance(pod_template.get(part) or {}, dict)]
    if wrong:
        return wrong
    spec = pod_template.get("spec") or {}
    if not isinstance((pod_template.get("metadata") or {}).get("annotations") or {}, dict):
        wrong.append("metadata.annotations: must be an object")
    if not isinstance(spec.get("securityContext") or {}, dict):
        wrong.append("spec.securityContext: must be an object")
    for field in (*CONTAINER_LISTS, "volumes"):
        items = spec.get(field) or []
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            wrong.append(f"spec.{field}: must be a list of objects")
        elif field != "volumes" and not all(isinstance(item.get("securityContext") or {}, dict) for item in items):
            wrong.append(f"spec.{field}: every securityContext must be an object")
    return wrong


def _volume(volume: dict[str, Any]) -> list[str]:
    sources = sorted(str(k) for k in volume if k != "name" and volume[k] is not None)
    refused = [s for s in sources if s not in ALLOWED_VOLUME_SOURCES]
    if refused:
        return [f"spec.volumes[{volume.get('name')}]: volume source {', '.join(refused)} is not allowed "
                f"(allowed: {', '.join(sorted(ALLOWED_VOLUME_SOURCES))})"]
    return []


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for field in CONTAINER_LISTS:
        for index, container in enumerate(spec.get(field) or []):
            yield f"spec.{field}[{container.get('name') or index}]", container


def _container(container: dict[str, Any], path: str) -> list[str]:
    found = _security_context(container.get("securityContext") or {}, f"{path}.securityContext", pod_level=False)
    for port in _list(container.get("ports")):
        if isinstance(port, dict) and port.get("hostPort") not in (None, 0):
            found.append(f"{path}.ports: hostPort is not allowed")
    for probe in PROBES:
        found += _host_field(_dict(container.get(probe)), f"{path}.{probe}")
    lifecycle = _dict(container.get("lifecycle"))
    for hook in LIFECYCLE_HOOKS:
        found += _host_field(_dict(lifecycle.get(hook)), f"{path}.lifecycle.{hook}")
    return found


def _host_field(handler: dict[str, Any], path: str) -> list[str]:
    return [f"{path}.{action}.host: probing another host is not allowed"
            for action in ("httpGet", "tcpSocket") if _dict(handler.get(action)).get("host")]


def _security_context(context: dict[str, Any], path: str, pod_level: bool) -> list[str]:
    found = []
    if not pod_level:
        if context.get("privileged") is True:
            found.append(f"{path}.privileged: privileged containers are not allowed")
        if context.get("allowPrivilegeEscalation") is True:
            found.append(f"{path}.allowPrivilegeEscalation: privilege escalation is not allowed")
        added = [str(c) for c in _list(_dict(context.get("capabilities")).get("add"))
                 if c not in ALLOWED_ADDED_CAPABILITIES]
        if added:
            found.append(f"{path}.capabilities.add: {', '.join(added)} may not be added "
                         f"(only {', '.join(sorted(ALLOWED_ADDED_CAPABILITIES))})")
        if context.get("procMount") not in (None, *ALLOWED_PROC_MOUNTS):
            found.append(f"{path}.procMount: only the Default /proc mount is allowed")
    if context.get("runAsUser") == 0:
        found.append(f"{path}.runAsUser: running as root (0) is not allowed")
    if context.get("runAsNonRoot") is False:
        found.append(f"{path}.runAsNonRoot: may not be false")
    for profile in ("seccompProfile", "appArmorProfile"):
        if _dict(context.get(profile)).get("type") == UNCONFINED:
            found.append(f"{path}.{profile}.type: Unconfined is not allowed")
    if _dict(context.get("windowsOptions")).get("hostProcess") is True:
        found.append(f"{path}.windowsOptions.hostProcess: host processes are not allowed")
    selinux = _dict(context.get("seLinuxOptions"))
    if selinux.get("type", "") not in ALLOWED_SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        found.append(f"{path}.seLinuxOptions: only the container types may be set, not user or role")
    if pod_level:
        unsafe = [str(_dict(s).get("name")) for s in _list(context.get("sysctls"))
                  if _dict(s).get("name") not in SAFE_SYSCTLS]
        if unsafe:
            found.append(f"{path}.sysctls: {', '.join(unsafe)} may not be set (only the safe set)")
    return found


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []

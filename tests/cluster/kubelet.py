"""A process kubelet for tests only: it runs the test cluster's pods as local processes.

It registers one Node, binds every Pending pod to it (there is no scheduler) and, when a pod's
first container's `command[0]` is found on PATH (the repository's virtualenv first), runs
`command + args` from the repository root with the container's env resolved. A container without
`command` runs its image's entrypoint, as a container runtime would; the only images whose
entrypoint is known here are the worker image's (`queueworker` or `queueworker-worker`, any
registry and tag): the ENTRYPOINT of Dockerfile.worker, without its init (this kubelet reaps
each pod's process group itself). Pods with nothing to run here (other images) are reported
Running all the same, so Deployments become available.

Termination follows the real kubelet's contract: when a pod gets a deletionTimestamp, SIGTERM goes to
the main process only (a container runtime signals PID 1), then after the grace period SIGKILL goes
to the whole process group (a container's cgroup is torn down); then the pod is deleted with grace 0.

Not emulated: images, volumes, probes, init containers, sidecars, networking (every pod is
127.0.0.1), resource limits. Run it as `python -m tests.cluster.kubelet --kubeconfig K --state-dir D`.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

NODE_NAME = "process-kubelet"
POD_IP = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_IMAGES = {"queueworker", "queueworker-worker"}
INITS = {"tini", "/usr/bin/tini", "/sbin/tini"}


def image_entrypoint(image: str) -> list[str]:
    """The entrypoint of a worker image (from Dockerfile.worker, init dropped); [] for other images."""
    repository = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    if repository not in WORKER_IMAGES:
        return []
    line = next(line for line in (REPO_ROOT / "Dockerfile.worker").read_text().splitlines()
                if line.startswith("ENTRYPOINT"))
    entrypoint = json.loads(line.removeprefix("ENTRYPOINT"))
    if entrypoint and entrypoint[0] in INITS:
        entrypoint = entrypoint[entrypoint.index("--") + 1:] if "--" in entrypoint else entrypoint[1:]
    return entrypoint
MAX_RESTART_BACKOFF = 10.0
SHUTDOWN_GRACE = 5.0

log = logging.getLogger("process-kubelet")
Pod = dict[str, Any]


class ContainerConfigError(Exception):
    """The container's env refers to something missing; the real kubelet reports CreateContainerConfigError."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, `$$` escapes, the rest stays as is."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def _field(pod: Pod, path: str) -> str:
    """The fieldRef paths the downward API supports for env vars."""
    meta = pod["metadata"]
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
        return meta.get(m.group(1), {}).get(m.group(2), "")
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": NODE_NAME,
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": POD_IP,
        "status.hostIP": POD_IP,
    }
    if path not in simple:
        raise ContainerConfigError(f"unsupported fieldRef {path!r}")
    return simple[path]


@dataclass
class PodProcess:
    """One pod on this node, and the local process running its first container (if any)."""

    pod: Pod
    started: str = field(default_factory=_now)
    proc: subprocess.Popen | None = None
    container_started: str = ""
    restart_count: int = 0
    next_start: float = 0.0  # monotonic time of the next (re)start attempt
    last_exit: dict[str, Any] | None = None  # a containerStatus `terminated` block
    waiting: tuple[str, str] | None = None  # (reason, message) while the container is not running
    finished: bool = False  # exited and not to be restarted
    terminating: bool = False

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}_{self.pod['metadata']['name']}"


class ProcessKubelet:
    def __init__(self, api: client.CoreV1Api, state_dir: Path):
        self.api = api
        self.pod_dir = state_dir / "pods"
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        self.pods: dict[str, PodProcess] = {}  # by pod uid
        self.lock = threading.Lock()
        venv_bin = str(Path(sys.executable).parent)
        self.base_env = {"PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", os.defpath)]),
                         "PYTHONUNBUFFERED": "1"}  # so pod logs are live, as container logs are
        self.base_env.update({k: os.environ[k] for k in ("HOME", "PYTHONPATH") if k in os.environ})

    # --- node -----------------------------------------------------------------------------------

    def register_node(self) -> None:
        try:
            self.api.create_node({"metadata": {"name": NODE_NAME, "labels": {
                "kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux"}}})
        except ApiException as e:
            if e.status != 409:
                raise
        now = _now()
        status = {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "process kubelet is posting ready status",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": POD_IP}, {"type": "Hostname", "address": NODE_NAME}],
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "250"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "250"},
        }
        self.api.patch_node_status(NODE_NAME, {"status": status}, _content_type="application/merge-patch+json")

    # --- pod sync (called for every listed or watched pod) -------------------------------------------

    def sync(self, pod: Pod) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        if not spec.get("nodeName"):
            if not meta.get("deletionTimestamp"):
                self._bind(pod)
            return
        if spec["nodeName"] != NODE_NAME or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        with self.lock:
            entry = self.pods.get(meta["uid"])
            if entry is None:
                entry = self.pods[meta["uid"]] = PodProcess(pod)
            entry.pod = pod
            deleting = bool(meta.get("deletionTimestamp")) and not entry.terminating
            if deleting:
                entry.terminating = True
        if deleting:
            threading.Thread(target=self._terminate, args=(entry,), name=f"terminate-{entry.key}").start()
        elif not entry.container_started and entry.next_start == 0.0:  # new here; retries are supervise_once's
            self._start(entry)

    def forget(self, pod: Pod) -> None:
        """The pod is gone from the API (force-deleted, or finalized by us): kill what is left of it."""
        with self.lock:
            entry = self.pods.pop(pod["metadata"]["uid"], None)
        if entry is not None:
            self._kill_group(entry)

    def _bind(self, pod: Pod) -> None:
        meta = pod["metadata"]
        body = {"metadata": {"name": meta["name"]}, "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME}}
        try:
            self.api.create_namespaced_pod_binding(meta["name"], meta["namespace"], body, _preload_content=False)
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or already bound
                raise

    # --- processes ------------------------------------------------------------------------------------

    def _argv(self, container: dict[str, Any], env: dict[str, str]) -> list[str] | None:
        command = container.get("command") or image_entrypoint(container.get("image", ""))
        if not command:
            return None
        executable = shutil.which(command[0], path=env["PATH"])
        if executable is None:
            return None
        return [executable, *(_expand(a, env) for a in [*command[1:], *container.get("args", [])])]

    def _start(self, entry: PodProcess) -> None:
        pod = entry.pod
        container = pod["spec"]["containers"][0]
        try:
            env = self._env(pod, container)
        except ContainerConfigError as e:
            entry.waiting, entry.next_start = ("CreateContainerConfigError", str(e)), time.monotonic() + 1
            self._report(entry)
            return
        argv = self._argv(container, env)
        if argv is not None:
            with (self.pod_dir / f"{entry.key}.log").open("ab") as out:
                entry.proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT, start_new_session=True)
            (self.pod_dir / f"{entry.key}.pid").write_text(str(entry.proc.pid))
            log.info("started %s: pid %d: %s", entry.key, entry.proc.pid, argv)
        entry.container_started, entry.waiting, entry.next_start = _now(), None, 0.0
        self._report(entry)

    def _env(self, pod: Pod, container: dict[str, Any]) -> dict[str, str]:
        namespace = pod["metadata"]["namespace"]
        env = {**self.base_env, "POD_NAME": pod["metadata"]["name"], "POD_NAMESPACE": namespace}
        for source in container.get("envFrom", []):
            kind, ref = ("ConfigMap", source["configMapRef"]) if "configMapRef" in source else ("Secret", source["secretRef"])
            data = self._data(kind, namespace, ref["name"], ref.get("optional", False))
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
        for var in container.get("env", []):
            value_from = var.get("valueFrom")
            if value_from is None:
                env[var["name"]] = _expand(var.get("value", ""), env)
            elif "fieldRef" in value_from:
                env[var["name"]] = _field(pod, value_from["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in value_from or "configMapKeyRef" in value_from:
                kind, ref = (("Secret", value_from["secretKeyRef"]) if "secretKeyRef" in value_from
                             else ("ConfigMap", value_from["configMapKeyRef"]))
                data = self._data(kind, namespace, ref["name"], ref.get("optional", False))
                if ref["key"] in data:
                    env[var["name"]] = data[ref["key"]]
                elif not ref.get("optional", False):
                    raise ContainerConfigError(f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}")
            else:
                raise ContainerConfigError(f"unsupported valueFrom for {var['name']}: {sorted(value_from)}")
        return env

    def _data(self, kind: str, namespace: str, name: str, optional: bool) -> dict[str, str]:
        read = self.api.read_namespaced_secret if kind == "Secret" else self.api.read_namespaced_config_map
        try:
            obj = json.loads(read(name, namespace, _preload_content=False).data)
        except ApiException as e:
            if e.status == 404 and optional:
                return {}
            if e.status == 404:
                raise ContainerConfigError(f'{kind.lower()} "{name}" not found') from e
            raise
        if kind == "Secret":
            return {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
        return obj.get("data", {})

    def _kill_group(self, entry: PodProcess) -> None:
        if entry.proc is None:
            return
        try:
            os.killpg(entry.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        entry.proc.wait()
        (self.pod_dir / f"{entry.key}.pid").unlink(missing_ok=True)

    def _terminate(self, entry: PodProcess) -> None:
        """SIGTERM, grace period, SIGKILL, then finalize the pod, like the real kubelet."""
        meta = entry.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = entry.pod["spec"].get("terminationGracePeriodSeconds", 30)
        if entry.proc is not None and entry.proc.poll() is None:
            log.info("SIGTERM %s (pid %d), grace %ss", entry.key, entry.proc.pid, grace)
            entry.proc.send_signal(signal.SIGTERM)
            try:
                entry.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.info("grace period over, SIGKILL %s", entry.key)
        self._kill_group(entry)
        try:
            self.api.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0,
                                           body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        except ApiException as e:
            if e.status not in (404, 409):
                log.exception("finalizing %s failed", entry.key)
        with self.lock:
            self.pods.pop(meta["uid"], None)

    def supervise_once(self) -> None:
        """Notice exited processes, apply the restart policy with backoff, retry config errors."""
        with self.lock:
            entries = [e for e in self.pods.values() if not e.terminating and not e.finished]
        for entry in entries:
            if entry.proc is None:
                if entry.next_start and time.monotonic() >= entry.next_start:
                    self._start(entry)
                continue
            code = entry.proc.poll()
            if code is None:
                continue
            self._kill_group(entry)  # leftover children die with the container
            entry.proc = None
            entry.last_exit = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                               "startedAt": entry.container_started, "finishedAt": _now()}
            policy = entry.pod["spec"].get("restartPolicy", "Always")
            if policy == "Always" or (policy == "OnFailure" and code != 0):
                backoff = min(MAX_RESTART_BACKOFF, 2.0 ** entry.restart_count)
                entry.restart_count += 1
                entry.waiting = ("CrashLoopBackOff", f"back-off {backoff:.0f}s restarting failed container")
                entry.next_start = time.monotonic() + backoff
            else:
                entry.finished = True
            log.info("%s exited with %d (restarts: %d)", entry.key, code, entry.restart_count)
            self._report(entry)

    # --- status ---------------------------------------------------------------------------------

    def _report(self, entry: PodProcess) -> None:
        pod = entry.pod
        first, *others = pod["spec"]["containers"]
        if entry.finished:
            phase, state = ("Succeeded" if entry.last_exit["exitCode"] == 0 else "Failed"), {"terminated": entry.last_exit}
        elif entry.waiting:
            phase, state = "Running" if entry.restart_count else "Pending", {
                "waiting": {"reason": entry.waiting[0], "message": entry.waiting[1]}}
        else:
            phase, state = "Running", {"running": {"startedAt": entry.container_started}}
        ready = "running" in state
        container_id = f"process://{entry.proc.pid}" if entry.proc else None
        statuses = [{"name": first["name"], "image": first.get("image", ""), "imageID": "", "ready": ready,
                     "started": ready, "restartCount": entry.restart_count, "state": state,
                     "lastState": {"terminated": entry.last_exit} if entry.last_exit and not entry.finished else {},
                     **({"containerID": container_id} if container_id else {})}]
        statuses += [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "started": True,
                      "restartCount": 0, "state": {"running": {"startedAt": entry.started}}} for c in others]
        conditions = [{"type": t, "status": s, "lastTransitionTime": _now()} for t, s in (
            ("PodScheduled", "True"), ("Initialized", "True"), ("PodReadyToStartContainers", "True"),
            ("ContainersReady", str(ready)), ("Ready", str(ready)))]
        status = {"phase": phase, "conditions": conditions, "containerStatuses": statuses,
                  "hostIP": POD_IP, "hostIPs": [{"ip": POD_IP}], "podIP": POD_IP, "podIPs": [{"ip": POD_IP}],
                  "startTime": entry.started}
        meta = pod["metadata"]
        try:
            self.api.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status},
                                                 _content_type="application/merge-patch+json")
        except ApiException as e:
            if e.status != 404:
                raise

    # --- main loop --------------------------------------------------------------------------------

    def _guarded(self, what: str, fn, *args) -> None:
        """One failing pod must not stop the kubelet: log and carry on (the next resync retries)."""
        try:
            fn(*args)
        except Exception:
            log.exception("%s failed", what)

    def _supervise_forever(self) -> None:
        while True:
            self._guarded("supervising", self.supervise_once)
            time.sleep(0.5)

    def run(self) -> None:
        """List, then watch from the list's resourceVersion; relist on any watch error or expiry (410)."""
        self.register_node()
        threading.Thread(target=self._supervise_forever, name="supervisor", daemon=True).start()
        while True:
            try:
                listing = json.loads(self.api.list_pod_for_all_namespaces(_preload_content=False).data)
                present = {pod["metadata"]["uid"] for pod in listing["items"]}
                for pod in listing["items"]:
                    self._guarded(f"syncing {pod['metadata']['name']}", self.sync, pod)
                with self.lock:
                    vanished = [e.pod for uid, e in self.pods.items() if uid not in present]
                for pod in vanished:
                    self.forget(pod)
                stream = watch.Watch().stream(self.api.list_pod_for_all_namespaces, timeout_seconds=60,
                                              resource_version=listing["metadata"]["resourceVersion"],
                                              allow_watch_bookmarks=True)
                for event in stream:
                    pod = event["raw_object"]
                    if event["type"] == "DELETED":
                        self._guarded(f"forgetting {pod['metadata']['name']}", self.forget, pod)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self._guarded(f"syncing {pod['metadata']['name']}", self.sync, pod)
            except Exception as e:  # noqa: BLE001 - expired watch, apiserver restart: relist
                log.warning("watch ended (%s); relisting", e)
                time.sleep(1)

    def shutdown(self) -> None:
        """The kubelet stops: its pods' processes stop with it (SIGTERM, short grace, SIGKILL)."""
        with self.lock:
            entries = list(self.pods.values())
        for entry in entries:
            if entry.proc is not None and entry.proc.poll() is None:
                entry.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + SHUTDOWN_GRACE
        for entry in entries:
            if entry.proc is not None:
                try:
                    entry.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            self._kill_group(entry)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(levelname)s %(message)s")
    configuration = client.Configuration()
    config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    kubelet = ProcessKubelet(client.CoreV1Api(client.ApiClient(configuration)), args.state_dir)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        kubelet.run()
    finally:
        kubelet.shutdown()


if __name__ == "__main__":
    main()

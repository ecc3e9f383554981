"""Leader election on a `coordination.k8s.io/v1` Lease: several controller replicas, one acting.

The algorithm is client-go's. A candidate takes the Lease when it is free, released, or when the
record it holds has not changed for the record's `leaseDurationSeconds` *by the candidate's own
clock* (clocks of different machines are never compared), counted from when the candidate's read
of that record returned, never from before the request (`_observe`). Every write is an update on the version
that was read, so of two candidates only one wins. The leader renews every `retry_seconds`, and
counts itself the leader only until `renew_deadline_seconds` after it *sent* its last successful
renewal: shorter than the lease, so it has stopped before any other replica may take over.

The process model keeps it simple: a standby replica does nothing but try to take the Lease; once it
leads, it starts the operator; a leader that cannot renew in time exits at once (`ensure_leading`
is also checked before every write to the cluster, kopf's own included: `guard_kopf_writes`), and
its pod restarts as a standby. A leader stopping cleanly releases the Lease, so the standby takes
over within one retry.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import math
import os
import random
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from kopf._cogs.clients import api as kopf_api
from kubernetes import client
from kubernetes.client.rest import ApiException

from . import metrics
from .kube import FIELD_MANAGER, api_error, response_json

log = logging.getLogger(__name__)

# The exit code of a leader that lost its Lease (its pod restarts as a standby).
EXIT_LEADERSHIP_LOST = 3
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class ElectionTiming:
    """How long a Lease lasts, how long a leader may go without renewing, how often everyone tries.
    A dead leader is replaced within about lease + 2 x retry seconds (plus the operator's start)."""

    lease_seconds: float = 8.0
    renew_deadline_seconds: float = 5.0
    retry_seconds: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError(f"leader election needs 0 < retry ({self.retry_seconds:g}s) < renew deadline "
                             f"({self.renew_deadline_seconds:g}s) < lease ({self.lease_seconds:g}s)")


def default_identity() -> str:
    """Unique per process: the pod's name (or host name) and a random suffix, as client-go does."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str | None:
    """$POD_NAMESPACE, else the ServiceAccount's namespace when running in a pod."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as file:
            return file.read().strip() or None
    except OSError:
        return None


class NotLeading(Exception):
    """A write was refused because this replica does not lead (raised only where losing the lead
    does not end the process, as in tests)."""


class LeaderElector:
    def __init__(self, api: client.ApiClient, namespace: str, name: str, identity: str,
                 timing: ElectionTiming = ElectionTiming(), monotonic: Callable[[], float] = time.monotonic,
                 on_lost: Callable[[], None] | None = None):
        self._leases = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity, self.timing = namespace, name, identity, timing
        self._monotonic = monotonic
        self._on_lost = on_lost or _exit_lost
        self._observed: tuple[Any, ...] | None = None  # the other holder's record as last read
        self._observed_at = -math.inf  # when it was first read so (monotonic)
        self._leading_until = -math.inf  # monotonic
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # -- the state ---------------------------------------------------------------------------

    def leading(self) -> bool:
        return self._monotonic() < self._leading_until

    def ensure_leading(self) -> None:
        """Called before every write: a replica whose leadership lapsed must not write, so it stops
        here (by default the process exits, and its pod restarts as a standby)."""
        if not self.leading():
            self._lost("leadership lapsed before a write")

    # -- one attempt -------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One read and (when the Lease is free, expired or ours) one write; True when this replica
        leads afterwards. API errors count as failures (logged), never raise."""
        sent = self._monotonic()  # before the read, so before the renewal is sent: the leader's count starts here
        timeout = (min(5.0, self.timing.renew_deadline_seconds), self.timing.renew_deadline_seconds)
        try:
            lease = self._read(timeout)
            if lease is None:
                self._create(timeout)
            else:
                spec = lease.get("spec") or {}
                self._observe(spec)
                holder = spec.get("holderIdentity") or ""
                if holder and holder != self.identity and not self._expired(spec, sent):
                    return False
                self._replace(lease, holder, timeout)
        except ApiException as exc:
            if exc.status != 409:  # 409: another candidate wrote first; nothing to report
                log.warning("leader election: Lease %s/%s: %s", self.namespace, self.name, api_error(exc))
            return False
        except Exception as exc:  # noqa: BLE001 - network errors of any kind: the next attempt retries
            log.warning("leader election: Lease %s/%s: %s: %s", self.namespace, self.name, type(exc).__name__, exc)
            return False
        self._leading_until = sent + self.timing.renew_deadline_seconds
        return True

    def _observe(self, spec: dict[str, Any]) -> None:
        """Notes a record read from the API server, and when this replica first saw it: the clock is
        read once the read has returned (client-go's `observedTime`), never before it was sent. A
        read that took long counts from its answer, so the holder's renewal that the answer carries
        is never aged by the time the request spent on its way."""
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"),
                  spec.get("leaseTransitions"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, self._monotonic()

    def _expired(self, spec: dict[str, Any], now: float) -> bool:
        """True once another holder's record has stayed unchanged for its lease duration, as
        measured by this replica's clock from when it first saw that record (`_observe`); `now` is
        the time this attempt began, before its read (as client-go compares), which errs towards
        waiting longer."""
        duration = spec.get("leaseDurationSeconds") or self.timing.lease_seconds
        return now >= self._observed_at + float(duration)

    def _read(self, timeout: tuple[float, float]) -> dict[str, Any] | None:
        try:
            return response_json(self._leases.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                            _request_timeout=timeout))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _record(self, acquire_time: str, transitions: int) -> dict[str, Any]:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": math.ceil(self.timing.lease_seconds),
                "acquireTime": acquire_time, "renewTime": _micro_time(), "leaseTransitions": transitions}

    def _create(self, timeout: tuple[float, float]) -> None:
        self._leases.create_namespaced_lease(self.namespace, {
            "metadata": {"name": self.name}, "spec": self._record(_micro_time(), 0)},
            field_manager=FIELD_MANAGER, _request_timeout=timeout)
        log.info("leader election: %s created Lease %s/%s and leads", self.identity, self.namespace, self.name)

    def _replace(self, lease: dict[str, Any], holder: str, timeout: tuple[float, float]) -> None:
        spec = lease.get("spec") or {}
        transitions = int(spec.get("leaseTransitions") or 0)
        renewing = holder == self.identity
        record = self._record(spec.get("acquireTime") or _micro_time(), transitions) if renewing else \
            self._record(_micro_time(), transitions + 1)
        self._leases.replace_namespaced_lease(self.name, self.namespace, {
            "metadata": {"name": self.name, "resourceVersion": lease["metadata"]["resourceVersion"]},
            "spec": record}, field_manager=FIELD_MANAGER, _request_timeout=timeout)
        if not renewing:
            log.info("leader election: %s took Lease %s/%s over from %s", self.identity, self.namespace,
                     self.name, holder or "nobody (released)")

    # -- the loops ---------------------------------------------------------------------------

    def wait_until_leading(self) -> None:
        """Blocks until this replica leads (a standby spends its life here)."""
        metrics.leader.set(0)
        log.info("leader election: %s is a candidate for Lease %s/%s", self.identity, self.namespace, self.name)
        while not self.try_acquire_or_renew():
            time.sleep(self.timing.retry_seconds * random.uniform(1.0, 1.2))
        metrics.leader.set(1)
        log.info("leader election: %s leads", self.identity)

    def start_renewing(self) -> None:
        """Renews from a thread of its own, so a busy event loop cannot cost the Lease."""
        self._renewer = threading.Thread(target=self._keep_leading, name="leader-election", daemon=True)
        self._renewer.start()

    def _keep_leading(self) -> None:
        while not self._stop.wait(self.timing.retry_seconds):
            if not self.try_acquire_or_renew() and not self.leading():
                self._lost(f"could not renew Lease {self.namespace}/{self.name} within "
                           f"{self.timing.renew_deadline_seconds:g}s")
                return

    def release(self) -> None:
        """Stops renewing and, when still leading, gives the Lease up so a standby takes over at once."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=self.timing.renew_deadline_seconds)
        if not self.leading():
            return
        try:
            lease = self._read((2.0, 2.0))
            if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                self._leases.replace_namespaced_lease(self.name, self.namespace, {
                    "metadata": {"name": self.name, "resourceVersion": lease["metadata"]["resourceVersion"]},
                    "spec": {**lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1,
                             "renewTime": _micro_time()}},
                    field_manager=FIELD_MANAGER, _request_timeout=(2.0, 2.0))
                log.info("leader election: %s released Lease %s/%s", self.identity, self.namespace, self.name)
        except Exception as exc:  # noqa: BLE001 - best effort: the Lease expires by itself
            log.warning("leader election: could not release Lease %s/%s: %s", self.namespace, self.name, exc)
        self._leading_until = -math.inf
        metrics.leader.set(0)

    def _lost(self, why: str) -> None:
        self._leading_until = -math.inf
        metrics.leader.set(0)
        log.critical("leader election: %s lost the lead: %s; stopping", self.identity, why)
        self._on_lost()


def guard_kopf_writes(leader: LeaderElector) -> None:
    """Makes kopf's own writes (the finalizer, its progress and diff-base annotations, status
    patches, Events) check the lead first, as the controller's own writes do (`Kube.before_write`):
    every request kopf makes goes through `kopf._cogs.clients.api.request`, so its writes (any
    method but GET: watches and reads stay free) are refused there once the lead has lapsed. kopf
    has no public hook for this; tests/test_controller_leader.py holds the wrapped function to it."""
    send = kopf_api.request

    async def request(*args: Any, **kwargs: Any) -> Any:
        method = str(kwargs.get("method", args[0] if args else "")).lower()
        if method != "get" and not leader.leading():
            leader.ensure_leading()  # by default the process ends here
            raise NotLeading(f"kopf's {method.upper()} refused: this replica does not lead")
        return await send(*args, **kwargs)

    kopf_api.request = request


@contextlib.contextmanager
def standby_liveness(endpoint: str | None) -> Iterator[None]:
    """Answers the liveness probe at kopf's endpoint (`http://host:port/path`) while this replica
    waits as a standby, before kopf serves it: a standby is alive, not to be restarted."""
    if endpoint is None:
        yield
        return
    parts = urllib.parse.urlsplit(endpoint)
    host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            requested, _, _ = self.path.partition("?")
            found = requested == path
            body = b'{"standby": true}' if found else b"{}"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass  # probes every few seconds: not worth a log line

    server_class = type("Server", (http.server.ThreadingHTTPServer,),
                        {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    server = server_class((host, port), Health)
    thread = threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def _exit_lost() -> None:
    """No cleanup that could write: the process ends now, and its pod restarts as a standby."""
    logging.shutdown()
    os._exit(EXIT_LEADERSHIP_LOST)


def _micro_time() -> str:
    """A Kubernetes MicroTime: RFC 3339 with microseconds."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

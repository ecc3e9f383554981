"""`queueworker-controller`: the QueueWorker operator (kopf underneath)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import kopf
from prometheus_client import start_http_server

from . import operator  # noqa: F401 - registers the handlers
from . import redaction
from .kube import Kube, load_config
from .leader import (
    ElectionTiming, LeaderElector, default_identity, default_namespace, guard_kopf_writes, standby_liveness,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="queueworker-controller",
                                     description="Scale QueueWorker Deployments from Postgres queue depth.")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", dest="namespaces", default=[], metavar="NS",
                       help="watch this namespace (repeatable; kopf globs allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace (the default when no --namespace is given)")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    parser.add_argument("--metrics-address", default="0.0.0.0", metavar="ADDR",
                        help="address the metrics server binds (default: every interface)")
    parser.add_argument("--liveness", default=None, metavar="URL",
                        help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz (its host is the bind address)")
    parser.add_argument("--allow-privileged-templates", action="store_true",
                        help="deploy QueueWorker pod templates that ask for privileges (host namespaces, "
                             "privileged containers, hostPath...); off: such QueueWorkers get Ready=False InvalidSpec")
    parser.add_argument("--service-account", metavar="NAMESPACE/NAME", type=_service_account, default=_own_account(),
                        help="the ServiceAccount this controller runs as: QueueWorkers may not run their pods as it "
                             "(default: $POD_NAMESPACE/$POD_SERVICE_ACCOUNT, which the chart sets)")
    election = parser.add_argument_group("leader election (several replicas, one acting)")
    election.add_argument("--leader-election", action="store_true",
                          help="act only while holding a coordination.k8s.io Lease; wait as a standby otherwise")
    election.add_argument("--leader-election-namespace", metavar="NS", default=None,
                          help="namespace of the Lease (default: $POD_NAMESPACE, or the pod's own namespace)")
    election.add_argument("--leader-election-name", metavar="NAME", default="queueworker-controller",
                          help="name of the Lease (default: %(default)s)")
    election.add_argument("--leader-election-identity", metavar="ID", default=None,
                          help="this replica's name in the Lease (default: $POD_NAME or the host name, plus a "
                               "random suffix)")
    defaults = ElectionTiming()
    election.add_argument("--leader-election-lease-seconds", type=float, default=defaults.lease_seconds,
                          metavar="S", help="how long a Lease lasts unrenewed (default: %(default)g)")
    election.add_argument("--leader-election-renew-deadline-seconds", type=float,
                          default=defaults.renew_deadline_seconds, metavar="S",
                          help="a leader that could not renew for this long stops (default: %(default)g)")
    election.add_argument("--leader-election-retry-seconds", type=float, default=defaults.retry_seconds,
                          metavar="S", help="how often to renew, or to try to take over (default: %(default)g)")
    parser.add_argument("--verbose", action="store_true", help="log kopf's handling in detail")
    parser.add_argument("--log-format", choices=("plain", "full", "json"), default="full")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if not args.verbose:  # kopf logs every timer run ("succeeded") at INFO on this logger
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    redaction.install_everywhere()
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, addr=args.metrics_address)
    leader = _elector(args) if args.leader_election else None
    # A standby builds its client before it waits: the Kubernetes client loads its API modules on
    # first use (over a second of CPU), which a standby taking over must not spend between the Lease
    # and its first write. Without election the operator's start builds it (where kopf retries a
    # configuration that is missing, saying so).
    kube = None if leader is None else Kube(load_config(), before_write=leader.ensure_leading)
    if leader is not None:
        with standby_liveness(args.liveness):
            leader.wait_until_leading()
        leader.start_renewing()
        guard_kopf_writes(leader)
    # kopf peering is not used: the Lease decides who acts (docs/controller.md), so kopf runs standalone.
    try:
        kopf.run(standalone=True, clusterwide=not args.namespaces, namespaces=args.namespaces,
                 liveness_endpoint=args.liveness,
                 memo=kopf.Memo(allow_privileged_templates=args.allow_privileged_templates, leader=leader,
                                kube=kube, service_account=args.service_account))
    finally:
        if leader is not None:
            leader.release()
    return 0


def _service_account(text: str) -> tuple[str, str]:
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME, got {text[:100]!r}")
    return namespace, name


def _own_account() -> tuple[str, str] | None:
    namespace, name = os.environ.get("POD_NAMESPACE"), os.environ.get("POD_SERVICE_ACCOUNT")
    return (namespace, name) if namespace and name else None


def _elector(args: argparse.Namespace) -> LeaderElector:
    """This replica's candidate for the Lease the flags name, with a client of its own (renewals never
    wait behind the operator's requests)."""
    namespace = args.leader_election_namespace or default_namespace()
    if not namespace:
        raise SystemExit("queueworker-controller: --leader-election needs --leader-election-namespace "
                         "(or $POD_NAMESPACE) outside a pod")
    try:
        timing = ElectionTiming(args.leader_election_lease_seconds, args.leader_election_renew_deadline_seconds,
                                args.leader_election_retry_seconds)
    except ValueError as exc:
        raise SystemExit(f"queueworker-controller: {exc}") from None
    return LeaderElector(load_config(), namespace, args.leader_election_name,
                         args.leader_election_identity or default_identity(), timing)


if __name__ == "__main__":
    sys.exit(main())

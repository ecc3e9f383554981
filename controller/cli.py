"""`queueworker-controller`: the QueueWorker operator (kopf underneath)."""

from __future__ import annotations

import argparse
import logging
import sys

import kopf
from prometheus_client import start_http_server

from . import operator  # noqa: F401 - registers the handlers
from . import redaction


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
    # One replica by design (see docs/controller.md): standalone, no peering objects needed.
    kopf.run(standalone=True, clusterwide=not args.namespaces, namespaces=args.namespaces,
             liveness_endpoint=args.liveness,
             memo=kopf.Memo(allow_privileged_templates=args.allow_privileged_templates))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m tests.cluster build | start [--node [--services]] --state-dir DIR | stop --state-dir DIR`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import images
from .binaries import BINARIES, CONTROL_PLANE_BINARIES, BinariesUnavailable, ensure_binaries
from .controlplane import ControlPlane, ControlPlaneError
from .node import NodeUnavailable, ensure_host_packages


def build() -> None:
    """Everything the tier uses, so no test timeout pays for it: every binary, the node's images and,
    as root, the node's Debian packages."""
    print(ensure_binaries(BINARIES))
    if os.geteuid() == 0:
        ensure_host_packages()
    else:
        print("not root: the real node's packages (containerd, runc, iptables, gcc) are not checked",
              file=sys.stderr)
    images.pause_archive()
    images.busybox_archive()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build (or reuse) the binaries and images; prints the binaries' directory")
    start = commands.add_parser("start", help="start the control plane and a kubelet in the background")
    start.add_argument("--node", action="store_true",
                       help="a real node (kubelet, containerd, CNI; needs root) instead of the process kubelet")
    start.add_argument("--services", action="store_true",
                       help="a real node with service networking: kube-proxy, a cluster DNS, the API server on the "
                            "node's IP (one such node per machine)")
    stop = commands.add_parser("stop", help="stop everything started in --state-dir")
    for command in (start, stop):
        command.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build()
        elif args.command == "start":
            started = time.monotonic()
            plane = ControlPlane(args.state_dir, node=args.node, services=args.services)
            plane.start(ensure_binaries(BINARIES if plane.wants_node else CONTROL_PLANE_BINARIES))
            plane.hand_over()
            print(f"{'cluster with a real node' if plane.wants_node else 'control plane'} ready in "
                  f"{time.monotonic() - started:.1f}s; export KUBECONFIG={plane.kubeconfig}", file=sys.stderr)
        else:
            ControlPlane(args.state_dir).stop()
    except (BinariesUnavailable, ControlPlaneError, NodeUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

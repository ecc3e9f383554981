"""`python -m tests.cluster build | start --state-dir DIR | stop --state-dir DIR`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .binaries import BinariesUnavailable, ensure_binaries
from .controlplane import ControlPlane, ControlPlaneError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build (or reuse) the binaries; prints their directory")
    for name, text in (("start", "start the control plane and process kubelet in the background"),
                       ("stop", "stop everything started in --state-dir")):
        commands.add_parser(name, help=text).add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(ensure_binaries())
        elif args.command == "start":
            started = time.monotonic()
            plane = ControlPlane(args.state_dir).start(ensure_binaries())
            print(f"control plane ready in {time.monotonic() - started:.1f}s; "
                  f"export KUBECONFIG={plane.kubeconfig}", file=sys.stderr)
        else:
            ControlPlane(args.state_dir).stop()
    except (BinariesUnavailable, ControlPlaneError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

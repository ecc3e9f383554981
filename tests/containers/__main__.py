"""python -m tests.containers build | base | save TAG PATH | stop-engine

  build        ensure the engine and build (or reuse) the base, worker and controller images;
               prints `NAME TAG` for each, timings on stderr
  base         ensure the engine and the base image only; prints its tag (for `--build-arg PYTHON_IMAGE`)
  save         `docker save` TAG into the tarball PATH
  stop-engine  stop the dockerd that this package started (if any)
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

from . import ContainersUnavailable
from .base import ensure_base
from .engine import DockerError, ensure_engine, stop_engine
from .images import ImageBuildFailed, ensure_images, save


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.containers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build (or reuse) all three images; prints their tags")
    commands.add_parser("base", help="build (or reuse) the base image; prints its tag")
    save_parser = commands.add_parser("save", help="write an image to a tarball")
    save_parser.add_argument("tag")
    save_parser.add_argument("path", type=Path)
    commands.add_parser("stop-engine", help="stop the dockerd started by this package")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    started = time.monotonic()
    try:
        if args.command == "build":
            for name, tag in asdict(ensure_images()).items():
                print(name, tag)
        elif args.command == "base":
            print(ensure_base(ensure_engine()))
        elif args.command == "save":
            print(save(args.tag, args.path))
        elif not stop_engine():
            print("no dockerd started by tests.containers is running", file=sys.stderr)
    except (ContainersUnavailable, ImageBuildFailed, DockerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    logging.info("%s done in %.0f s", args.command, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())

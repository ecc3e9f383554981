"""`queueworker demo`, `console` and `dev-db`: the whole system on one machine, the web console, and
a Postgres for development. The work is done by queueworker.dev and queueworker.console; here the
arguments are read and the outcome printed."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..dev.demo import DemoConfig
from ..dev.devdb import DIR_ENV, EXIT_NOT_RUNNING, DevDb, DevDbError, default_dir
from ..dev.localpg import PostgresNotFound
from ..logs import configure_logging, default_format
from ..settings import one_line
from .common import CliError, bounded_int, command, default, secrets


def add_demo(sub: Any, common: argparse.ArgumentParser) -> None:
    demo = command(sub, "demo", help="run it all locally: a throwaway Postgres, a burst of tasks, "
                   "workers scaled by the controller's policy")
    demo.add_argument("--tasks", type=int, default=default(DemoConfig, "tasks"), help="qw.sleep tasks to enqueue")
    demo.add_argument("--task-seconds", type=float, default=default(DemoConfig, "task_seconds"),
                      help="how long each task sleeps")
    demo.add_argument("--concurrency", type=int, default=default(DemoConfig, "concurrency"),
                      help="slots per worker process")
    demo.add_argument("--tasks-per-worker", type=int, default=None, metavar="N",
                      help="ready tasks per worker the scaling aims for (default: --concurrency)")
    demo.add_argument("--min-workers", type=int, default=default(DemoConfig, "min_workers"), metavar="N",
                      help="fewest worker processes")
    demo.add_argument("--max-workers", type=int, default=default(DemoConfig, "max_workers"), metavar="N",
                      help="most worker processes")
    demo.add_argument("--interval", type=float, default=default(DemoConfig, "interval"),
                      help="seconds between scaling decisions")
    demo.add_argument("--scale-down-window", type=float, default=default(DemoConfig, "scale_down_window"),
                      help="scale-down stabilization, seconds")
    demo.add_argument("--cooldown", type=float, default=default(DemoConfig, "cooldown"),
                      help="idle seconds before scaling to zero")
    demo.add_argument("--drain-seconds", type=float, default=default(DemoConfig, "drain_seconds"), metavar="SECONDS",
                      help="how long a removed worker may finish its tasks")
    demo.add_argument("--timeout", type=float, default=None, help="give up (exit 1) after this many seconds")
    demo.add_argument("--dsn", default=None, help="use this Postgres instead of a throwaway one")
    demo.add_argument("--no-tty", action="store_true", help="one line per tick instead of a live view")


def cmd_demo(args: argparse.Namespace) -> int:
    from ..dev.demo import run_demo

    try:
        config = DemoConfig.model_validate(vars(args))
    except ValidationError as exc:
        raise CliError(one_line(exc, {field: "--" + field.replace("_", "-") for field in vars(args)})) from None
    try:
        return run_demo(config)
    except PostgresNotFound as exc:
        raise CliError(str(exc)) from None


def add_console(sub: Any, common: argparse.ArgumentParser) -> None:
    console = command(sub, "console", parents=[common], help="serve the web console (docs/console.md)")
    console.add_argument("--host", default="127.0.0.1", help="address to listen on")
    console.add_argument("--port", type=bounded_int(1, 65535), default=8080, help="port")
    console.add_argument("--allow-actions", action="store_true",
                         help="offer retry, cancel, pause and resume (needs a token: $QUEUEWORKER_CONSOLE_TOKEN, "
                              "$QUEUEWORKER_CONSOLE_TOKEN_FILE or --token-file)")
    console.add_argument("--token-file", default=None, help="file holding the token (a mounted Secret)")
    console.add_argument("--kubeconfig", default=None,
                         help="read QueueWorkers with this kubeconfig (default: the in-cluster configuration)")
    console.add_argument("--namespace", action="append", dest="namespaces", default=[], metavar="NS",
                         help="show the QueueWorkers of this namespace (repeatable; default: every namespace, "
                              "which needs the right to list them cluster-wide)")
    console.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                         help="a host name requests may give besides localhost and IP addresses (an "
                              "ingress's or a Service's); repeatable, added to the comma-separated "
                              "$QUEUEWORKER_CONSOLE_ALLOWED_HOSTS")
    console.add_argument("--secure-cookies", action="store_true",
                         help="mark the form cookie Secure (behind a TLS ingress; "
                              "also $QUEUEWORKER_CONSOLE_SECURE_COOKIES=true)")


def cmd_console(args: argparse.Namespace) -> int:
    """Serves the console until interrupted; refuses --allow-actions without a token."""
    try:
        import uvicorn

        from ..console import ConsoleConfig, CredentialsError, create_app, load_token
        from ..console.auth import ALLOWED_HOSTS_ENV, SECURE_COOKIES_ENV, allowed_hosts
    except ImportError as exc:
        raise CliError(f"the console needs its extra: pip install 'queueworker[console]' ({exc})") from None
    from_env = os.environ.get(ALLOWED_HOSTS_ENV, "")
    secure_env = os.environ.get(SECURE_COOKIES_ENV, "").strip().lower()
    if secure_env not in ("", "true", "false", "1", "0", "yes", "no"):
        raise CliError(f"${SECURE_COOKIES_ENV} must be true or false")
    try:
        hosts = allowed_hosts((*(h for h in from_env.split(",") if h.strip()), *args.allowed_host))
        config = ConsoleConfig(args.dsn, token=load_token(args.token_file), allow_actions=args.allow_actions,
                               kubeconfig=args.kubeconfig, namespaces=tuple(args.namespaces), allowed_hosts=hosts,
                               secure_cookies=args.secure_cookies or secure_env in ("true", "1", "yes"))
    except (CredentialsError, ValueError) as exc:
        raise CliError(str(exc)) from None
    configure_logging("INFO", json_format=default_format() == "json", secrets=[*secrets(args.dsn), config.token])
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again under the handler it
    # found: a handler that does nothing makes that graceful stop exit 0, as a pod's stop should.
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_config=None, proxy_headers=False,
                server_header=False)
    return 0


def add_dev_db(sub: Any, common: argparse.ArgumentParser) -> None:
    """`dev-db ACTION`; it takes no --dsn: it is the database."""
    parser = sub.add_parser("dev-db", help="a Postgres for development that keeps running: start, url, status, stop",
                            description="A Postgres for development that outlives the command; its data is kept "
                                        "between starts.")
    parser.add_argument("dev_db_action", choices=("start", "stop", "url", "status"), metavar="start|stop|url|status",
                        help="start (made on first use), stop, print its URL (password included: for "
                             "`export DATABASE_URL=$(queueworker dev-db url)`), or say whether it runs "
                             f"(exit {EXIT_NOT_RUNNING} when not)")
    parser.add_argument("--dir", type=Path, default=None,
                        help=f"where its data lives (default ${DIR_ENV}, else ~/.local/share/queueworker/dev-db; "
                             "as root /var/lib/queueworker/dev-db)")


def cmd_dev_db(args: argparse.Namespace) -> int:
    db = DevDb(args.dir or default_dir())
    try:
        if args.dev_db_action == "start":
            server, started = db.start()
            print(f"queueworker dev-db {'started' if started else 'already running'} on 127.0.0.1:{server.port} "
                  f"(data {server.data_dir}, log {server.log_file}); `export DATABASE_URL=$(queueworker dev-db url)`, "
                  "`queueworker dev-db stop` to stop it", file=sys.stderr)
            return 0
        if args.dev_db_action == "stop":
            print("queueworker dev-db stopped" if db.stop() else "queueworker dev-db was not running", file=sys.stderr)
            return 0
        server = db.running()
        if server is None:
            print(f"queueworker dev-db is not running (directory {db.directory}): `queueworker dev-db start`",
                  file=sys.stderr)
            return EXIT_NOT_RUNNING if args.dev_db_action == "status" else 1
        if args.dev_db_action == "url":
            print(server.dsn)
        else:
            print(f"queueworker dev-db running on 127.0.0.1:{server.port} (data {server.data_dir})")
        return 0
    except (DevDbError, PostgresNotFound, RuntimeError, OSError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"queueworker: dev-db {args.dev_db_action}: {message}", file=sys.stderr)
        return 1

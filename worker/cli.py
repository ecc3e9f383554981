"""The `queueworker` command line: migrate, enqueue, worker, status, retry, cancel.

Every user error (bad JSON, bad option, unreachable database) ends in one line on stderr and
a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
from typing import Any

import psycopg
from pydantic import ValidationError

from . import __version__, status
from .logs import configure_logging

EXIT_USAGE = 2
EXIT_FAILURE = 1


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _json_payload(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="queueworker", description="Postgres lease queue workers.")
    parser.add_argument("--version", action="version", version=f"queueworker {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dsn", default=None, help="Postgres connection URL (default: $DATABASE_URL)")
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    sub.add_parser("migrate", parents=[common], help="create or upgrade the queueworker schema")

    enq = sub.add_parser("enqueue", parents=[common], help="enqueue tasks")
    enq.add_argument("task", help="task name, e.g. qw.sleep")
    enq.add_argument("--payload", type=_json_payload, default={}, help="JSON payload (default {})")
    enq.add_argument("--queue", default="default")
    enq.add_argument("--priority", type=int, default=0, help="higher runs first")
    enq.add_argument("--delay", type=float, default=None, help="seconds before the task may run")
    enq.add_argument("--max-attempts", type=_positive_int, default=None)
    enq.add_argument("--timeout", type=_positive_int, default=None, help="hard deadline per attempt, seconds")
    enq.add_argument("--count", type=_positive_int, default=1, help="enqueue this many copies")

    wrk = sub.add_parser("worker", parents=[common], help="run a worker process")
    wrk.add_argument("--queue", action="append", dest="queues", help="queue to work (repeatable; default: default)")
    wrk.add_argument("--handlers", action="append", default=[], help="module with @task handlers (repeatable)")
    wrk.add_argument("--command", action="append", default=[], dest="commands", metavar="NAME=COMMAND",
                     help="run COMMAND for tasks named NAME: payload on stdin, JSON result on stdout")
    wrk.add_argument("--concurrency", type=_positive_int, default=10)
    wrk.add_argument("--lease-seconds", type=float, default=30.0)
    wrk.add_argument("--heartbeat-seconds", type=float, default=10.0)
    wrk.add_argument("--drain-seconds", type=float, default=20.0)
    wrk.add_argument("--task-timeout", type=float, default=1800.0, help="default hard deadline per attempt")
    wrk.add_argument("--retry-base-seconds", type=float, default=1.0,
                     help="backoff after the first failed attempt; doubles per attempt, capped at 24 h")
    wrk.add_argument("--retention-hours", type=float, default=7 * 24.0,
                     help="delete finished tasks and their audit rows after this long (0: keep forever)")
    wrk.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    wrk.add_argument("--migrate", action="store_true", help="apply pending migrations before starting")
    wrk.add_argument("--log-level", default=os.environ.get("QUEUEWORKER_LOG_LEVEL", "INFO"))
    wrk.add_argument("--log-format", choices=("json", "text"), default="json")

    st = sub.add_parser("status", parents=[common], help="counts per queue and state, live workers")
    st.add_argument("--queue", default=None)
    st.add_argument("--json", action="store_true", help="print JSON")

    retry = sub.add_parser("retry", parents=[common], help="put a failed or cancelled task back to pending")
    retry.add_argument("id", type=int)
    cancel = sub.add_parser("cancel", parents=[common], help="cancel a pending, retrying or running task")
    cancel.add_argument("id", type=int)

    demo = sub.add_parser("demo", help="run it all locally: a throwaway Postgres, a burst of tasks, "
                          "workers scaled by the controller's policy")
    demo.add_argument("--tasks", type=_positive_int, default=300, help="qw.sleep tasks to enqueue")
    demo.add_argument("--task-seconds", type=float, default=1.0, help="how long each task sleeps")
    demo.add_argument("--concurrency", type=_positive_int, default=5, help="slots per worker process")
    demo.add_argument("--tasks-per-worker", type=_positive_int, default=None, help="default: --concurrency")
    demo.add_argument("--min-workers", type=int, default=0)
    demo.add_argument("--max-workers", type=_positive_int, default=8)
    demo.add_argument("--interval", type=float, default=1.0, help="seconds between scaling decisions")
    demo.add_argument("--scale-down-window", type=float, default=5.0, help="scale-down stabilization, seconds")
    demo.add_argument("--cooldown", type=float, default=5.0, help="idle seconds before scaling to zero")
    demo.add_argument("--drain-seconds", type=float, default=5.0)
    demo.add_argument("--timeout", type=float, default=None, help="give up (exit 1) after this many seconds")
    demo.add_argument("--dsn", default=None, help="use this Postgres instead of a throwaway one")
    demo.add_argument("--no-tty", action="store_true", help="one line per tick instead of a live view")
    return parser


def _dsn(args: argparse.Namespace) -> str:
    dsn = args.dsn or os.environ.get("DATABASE_URL")
    if not dsn:
        raise CliError("no database: pass --dsn or set DATABASE_URL")
    return dsn


def cmd_migrate(args: argparse.Namespace) -> int:
    from .migrate import latest_version, migrate

    applied = migrate(_dsn(args))
    names = ", ".join(f"{m.version:03d}_{m.name}" for m in applied) or "nothing to apply"
    print(f"schema at version {latest_version()} ({names})")
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    from .producer import TaskSpec, enqueue_many

    options: dict[str, Any] = {"task": args.task, "payload": args.payload, "queue": args.queue,
                               "priority": args.priority, "delay": args.delay, "timeout_seconds": args.timeout}
    if args.max_attempts is not None:
        options["max_attempts"] = args.max_attempts
    spec = TaskSpec(**options)
    with psycopg.connect(_dsn(args), application_name="queueworker-cli") as conn:
        ids = enqueue_many(conn, (spec for _ in range(args.count)))
    if len(ids) == 1:
        print(ids[0])
    else:
        print(f"enqueued {len(ids)} tasks (ids {ids[0]}..{ids[-1]}) on queue {args.queue}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from .external import register_commands
    from .handlers import default_registry
    from .settings import WorkerSettings
    from .worker import Worker

    configure_logging(args.log_level, args.log_format == "json")
    settings = WorkerSettings(
        queues=tuple(args.queues or ["default"]), concurrency=args.concurrency, lease_seconds=args.lease_seconds,
        heartbeat_seconds=args.heartbeat_seconds, drain_seconds=args.drain_seconds,
        task_timeout_seconds=args.task_timeout, retry_base_seconds=args.retry_base_seconds,
        retention_seconds=args.retention_hours * 3600,
        metrics_port=args.metrics_port)
    default_registry.import_modules(args.handlers)
    try:
        register_commands(default_registry, args.commands)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port)
    code = asyncio.run(Worker(_dsn(args), settings, default_registry, auto_migrate=args.migrate).run())
    if any(t.name.startswith("handler") and t.is_alive() for t in threading.enumerate()):
        # A sync handler ignored cancellation; its lease is already released. Do not wait for it.
        logging.shutdown()
        os._exit(code)
    return code


def cmd_status(args: argparse.Namespace) -> int:
    with psycopg.connect(_dsn(args), application_name="queueworker-cli") as conn:
        report = status.collect(conn, args.queue)
    print(json.dumps(report, indent=2, default=str) if args.json else status.render(report))
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    from . import sql

    row = _change_task(args, sql.RETRY_TASK, "failed or cancelled", notify=True)
    print(f"task {row[0]} is pending again on queue {row[1]} (attempts so far {row[2]}, max {row[3]})")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from . import sql

    row = _change_task(args, sql.CANCEL_TASK, "pending, retrying or running")
    print(f"task {row[0]} cancelled")
    return 0


def _change_task(args: argparse.Namespace, statement: str, allowed_states: str, notify: bool = False) -> tuple:
    """Runs an operator's state change on one task; explains why when it changes nothing.

    Through a DutyConnection, like the worker's statements: a change that meets a row moved
    between partitions meanwhile is re-run there (db.met_moved_row)."""
    from . import sql
    from .db import DutyConnection

    async def change() -> tuple:
        conn = DutyConnection(_dsn(args), "queueworker-cli")
        try:
            rows = await conn.fetch(statement, {"id": args.id})
            if not rows:
                current = await conn.fetch(sql.TASK_STATE, {"id": args.id})
                if not current:
                    raise CliError(f"no task with id {args.id}")
                raise CliError(f"task {args.id} is {current[0][0]}; only {allowed_states} tasks can be changed "
                               "this way")
            if notify:
                await conn.fetch(sql.NOTIFY_QUEUE, {"queue": rows[0][1]})
            return rows[0]
        finally:
            await conn.close()

    return asyncio.run(change())


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, run_demo
    from .localpg import PostgresNotFound

    try:
        return run_demo(DemoConfig.model_validate(vars(args)))
    except PostgresNotFound as exc:
        raise CliError(str(exc)) from None


COMMANDS = {"migrate": cmd_migrate, "enqueue": cmd_enqueue, "worker": cmd_worker, "status": cmd_status,
            "retry": cmd_retry, "cancel": cmd_cancel, "demo": cmd_demo}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.subcommand](args)
    except CliError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
        return _fail(f"invalid input: {problems}", EXIT_USAGE)
    except psycopg.Error as exc:
        return _fail(f"database error: {_first_line(exc)}", EXIT_FAILURE)
    except ImportError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return 130


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _fail(message: str, code: int) -> int:
    print(f"queueworker: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())

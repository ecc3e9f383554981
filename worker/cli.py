"""The `queueworker` command line: migrate, enqueue, worker, status, retry, cancel, demo.

Every user error (bad JSON, a bad flag or environment variable, a malformed or unreachable
database URL) ends in one line on stderr, `queueworker: ...`, and a non-zero exit status (2 for
usage errors), never a traceback. Nothing printed or logged carries the database password: the
URL is validated before anything starts, database errors are explained by `dsn.explain`, and
logs and messages are scrubbed of the URL and its password.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from datetime import UTC
from pathlib import Path
from typing import Any, NoReturn

import psycopg
from pydantic import ValidationError

from . import __version__, dsn as dsns, jsonvalue
from .client import status
from .dev.devdb import add_dev_db_parser, run_dev_db
from .client.status import STATES
from .logs import LEVELS, configure_logging, default_format
from .client.operations import CANCELLABLE
from .settings import SETTING_OPTIONS, SettingOption, SettingsError, WorkerSettings, one_line

EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
CONNECT_TIMEOUT_SECONDS = 10
MAX_COUNT = 1_000_000
MAX_PROCESSES = 256
BIGINT_MAX = 2**63 - 1
LOG_FORMATS = ("json", "text")
# What a command meets in a database that was never migrated (or migrated by an older version).
SCHEMA_MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedColumn,
                  psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedObject)
# TaskSpec fields as `queueworker enqueue` names them in messages.
ENQUEUE_LABELS = {"task": "TASK", "queue": "--queue", "priority": "--priority",
                  "delay": "--delay", "max_attempts": "--max-attempts", "timeout_seconds": "--timeout",
                  "dedupe_key": "--dedupe-key", "dedupe": "--dedupe-spec", "on_conflict": "--on-conflict",
                  "depends_on": "--after", "on_dependency_failure": "--on-dependency-failure", "headers": "--header"}


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class HelpFormatter(argparse.HelpFormatter):
    """--help shows each option's default where it has one and its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default in ([], argparse.SUPPRESS)
        if unset or "default" in text:
            return action.help
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one `queueworker: ...` line (exit 2)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"queueworker: {message} (see `{self.prog} --help`)\n")


def _bounded_int(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:,} to {high:,}")
        return value

    return parse


def _header(text: str) -> tuple[str, str]:
    """KEY=VALUE of --header; the value may contain `=` (TaskSpec checks both)."""
    name, equals, value = text.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text[:40]!r}")
    return name, value


def _default(model: Any, field: str) -> Any:
    return model.model_fields[field].default


def build_parser() -> argparse.ArgumentParser:
    from .dev.demo import DemoConfig
    from .client.producer import TaskSpec

    parser = ArgumentParser(prog="queueworker", description="Postgres lease queue workers.")
    parser.add_argument("--version", action="version", version=f"queueworker {__version__}")
    common = ArgumentParser(add_help=False)
    common.add_argument("--dsn", default=None, help="Postgres connection URL (default: $DATABASE_URL)")
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    _command(sub, "migrate", parents=[common], help="create or upgrade the queueworker schema")

    enq = _command(sub, "enqueue", parents=[common], help="enqueue tasks")
    enq.add_argument("task", help="task name, e.g. qw.sleep")
    source = enq.add_mutually_exclusive_group()
    source.add_argument("--payload", metavar="JSON", help="JSON payload; - reads it from stdin (default: {})")
    source.add_argument("--payload-file", metavar="FILE", help="read the JSON payload from FILE")
    enq.add_argument("--queue", help=f"the queue to add to (default: {_default(TaskSpec, 'queue')})")
    enq.add_argument("--priority", metavar="N",
                     help=f"higher runs first (default: {_default(TaskSpec, 'priority')})")
    enq.add_argument("--delay", metavar="SECONDS", help="seconds before the task may run")
    enq.add_argument("--max-attempts", metavar="N",
                     help=f"attempts before the task fails for good (default: {_default(TaskSpec, 'max_attempts')})")
    enq.add_argument("--timeout", metavar="SECONDS", help="hard deadline per attempt, whole seconds "
                                                          "(default: the worker's --task-timeout)")
    enq.add_argument("--count", type=_bounded_int(1, MAX_COUNT), default=1, metavar="N", help="enqueue this many copies")
    enq.add_argument("-q", "--quiet", action="store_true",
                     help="print only the task ids, one per line (for scripts: id=$(queueworker enqueue -q ...))")
    unique = enq.add_mutually_exclusive_group()
    unique.add_argument("--dedupe-key", metavar="KEY",
                        help="enqueue nothing while an unfinished task of the queue holds KEY (prints its id)")
    unique.add_argument("--dedupe-spec", action="store_true",
                        help="the same, with the task's spec hash (queue, task, payload) as the key")
    enq.add_argument("--after", action="append", type=_bounded_int(1, BIGINT_MAX), default=[], metavar="ID",
                     help="run only once task ID has succeeded (repeatable); the task waits as `blocked`")
    enq.add_argument("--on-dependency-failure", choices=("cancel", "run"),
                     help="when a task of --after ends failed or cancelled: cancel this one (default) or run it")
    enq.add_argument("--header", action="append", type=_header, default=[], metavar="KEY=VALUE",
                     help="a header stored with the task (repeatable), e.g. traceparent=00-...-01 to continue "
                          "a trace (docs/observability.md)")
    enq.add_argument("--notify-on-finish", action="store_true",
                     help="notify when the task ends, so queueworker.wait_for hears of it at once")
    enq.add_argument("--on-conflict", choices=("ignore", "replace"),
                     help="with a key held by a pending task: leave it (default), or replace its payload, "
                          "priority and schedule")

    wrk = _command(sub, "worker", parents=[common], help="run a worker process",
                         description="Run a worker process. Each setting is also read from the environment "
                                     "variable shown ($QUEUEWORKER_...; lists comma-separated); a flag wins "
                                     "over its variable.")
    wrk.add_argument("--handlers", action="append", default=[], help="module with @task handlers (repeatable)")
    wrk.add_argument("--command", action="append", default=[], dest="commands", metavar="NAME=COMMAND",
                     help="run COMMAND for tasks named NAME: payload on stdin, JSON result on stdout")
    wrk.add_argument("--migrate", action="store_true", help="apply pending migrations before starting")
    wrk.add_argument("--processes", type=_bounded_int(1, MAX_PROCESSES), default=None, metavar="N",
                     help="run N worker processes under one supervisor, for a pod with N CPUs; with "
                          "--metrics-port P, process i serves metrics on P+i (default: 1; $QUEUEWORKER_PROCESSES)")
    wrk.add_argument("--log-level", type=str.lower, choices=LEVELS,
                     help="(default: info; $QUEUEWORKER_LOG_LEVEL)")
    wrk.add_argument("--log-format", choices=LOG_FORMATS,
                     help="(default: text on a terminal, json otherwise; $QUEUEWORKER_LOG_FORMAT)")
    settings = wrk.add_argument_group("settings")
    for option in SETTING_OPTIONS:
        if option.is_switch:
            settings.add_argument(option.flag, dest=option.field, action="store_const", const="false", default=None,
                                  help=_setting_help(option))
        else:
            settings.add_argument(option.flag, dest=option.field, metavar=_metavar(option), default=None,
                                  action="append" if option.is_list else "store", help=_setting_help(option))

    st = _command(sub, "status", parents=[common], help="counts per queue and state, live workers")
    st.add_argument("--queue", default=None, help="only this queue (and the workers that work it)")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.add_argument("--stuck", action="store_true",
                    help="list running tasks whose lease has expired and that nobody has rescued yet")

    listing = _command(sub, "list", parents=[common], help="the newest tasks, by queue and state, with progress")
    listing.add_argument("--queue", default=None, help="only this queue")
    listing.add_argument("--state", choices=STATES, default=None, help="only tasks in this state")
    listing.add_argument("--limit", type=_bounded_int(1, 10_000), default=50, metavar="N", help="at most N tasks")
    listing.add_argument("--json", action="store_true", help="print JSON")

    retry = _command(sub, "retry", parents=[common], help="put a failed or cancelled task back to pending")
    retry.add_argument("id", type=_bounded_int(1, BIGINT_MAX))
    cancel = _command(sub, "cancel", parents=[common],
                            help="cancel unfinished tasks by id, or every one of a queue (--queue); a running "
                                 "task's handler is stopped at once")
    cancel.add_argument("ids", nargs="*", type=_bounded_int(1, BIGINT_MAX), metavar="ID")
    cancel.add_argument("--queue", help="cancel the queue's tasks instead of given ids")
    cancel.add_argument("--state", action="append", dest="states", choices=CANCELLABLE,
                        help="only tasks in this state (repeatable; default: all four)")
    cancel.add_argument("--reason", default="cancelled", help="recorded in the task's error and audit trail")

    pause = _command(sub, "pause", parents=[common],
                           help="stop claims of a queue (running tasks finish) until resumed, or --for a while")
    pause.add_argument("queue")
    pause.add_argument("--for", dest="duration", metavar="DURATION", help="e.g. 90s, 10m, 2h, 1d")
    resume = _command(sub, "resume", parents=[common], help="end a queue's pause and wake its workers")
    resume.add_argument("queue")
    limit = _command(sub, "limit", parents=[common],
                           help="rate-limit a queue and/or cap its running tasks across all workers")
    limit.add_argument("queue")
    limit.add_argument("--rate", metavar="N/s|N/m", help="tasks started per second (/s) or minute (/m)")
    limit.add_argument("--burst", type=_bounded_int(1, 1_000_000), help="tokens the bucket holds (default: 1 s)")
    limit.add_argument("--concurrency", type=_bounded_int(1, 1_000_000), metavar="N",
                       help="at most N of the queue's tasks running at once, across all workers")
    limit.add_argument("--clear", action="store_true", help="remove the queue's rate and concurrency limits")
    breaker = _command(sub, "breaker", parents=[common],
                             help="a circuit breaker: N consecutive failures stop claims for a cooldown, then "
                                  "one probe task decides")
    breaker.add_argument("queue")
    breaker.add_argument("--failures", type=_bounded_int(1, 1_000_000), metavar="N")
    breaker.add_argument("--cooldown", metavar="DURATION", help="e.g. 30s, 5m")
    breaker.add_argument("--off", action="store_true", help="remove the breaker")

    show = _command(sub, "show", parents=[common],
                          help="one task: its state, progress, payload, result or error, and its audit trail")
    show.add_argument("id", type=_bounded_int(1, BIGINT_MAX))
    show.add_argument("--json", action="store_true", help="print JSON")

    runs = _command(sub, "runs", parents=[common], help="partitioned runs, newest first")
    runs.add_argument("--name", default=None, help="only runs of this name")
    runs.add_argument("--limit", type=_bounded_int(1, 10_000), default=20, metavar="N", help="at most N runs")
    runs.add_argument("--json", action="store_true", help="print JSON")
    run = _command(sub, "run", help="start, show, retry or finalize a partitioned run")
    run_commands = run.add_subparsers(dest="run_command", required=True, metavar="COMMAND")
    run_start = _command(run_commands, "start", parents=[common],
                                        help="start a run of N partitions of TASK (payload {\"partition\": i})")
    run_start.add_argument("name")
    run_start.add_argument("--task", required=True)
    run_start.add_argument("--partitions", type=_bounded_int(1, MAX_COUNT), required=True)
    run_start.add_argument("--queue", help=f"the partitions' queue (default: {_default(TaskSpec, 'queue')})")
    run_start.add_argument("--on-success", metavar="TASK", help="the consolidation, enqueued once all succeeded")
    run_start.add_argument("--on-failure", metavar="TASK", help="the alert, enqueued once if a partition fails")
    run_start.add_argument("--watermark", metavar="NAME", help="advanced to the run's start when it succeeds")
    for command, text in (("show", "the run and each partition's state"),
                          ("retry", "retry the run's failed and cancelled partitions")):
        _command(run_commands, command, parents=[common], help=text).add_argument(
            "id", type=_bounded_int(1, BIGINT_MAX))
    finalize = _command(run_commands, "finalize", parents=[common],
                                       help="consolidate a failed run on purpose (needs --force)")
    finalize.add_argument("id", type=_bounded_int(1, BIGINT_MAX))
    finalize.add_argument("--force", action="store_true", required=True)

    _add_cron_parser(sub, common)

    demo = _command(sub, "demo", help="run it all locally: a throwaway Postgres, a burst of tasks, "
                          "workers scaled by the controller's policy")
    demo.add_argument("--tasks", type=int, default=_default(DemoConfig, "tasks"), help="qw.sleep tasks to enqueue")
    demo.add_argument("--task-seconds", type=float, default=_default(DemoConfig, "task_seconds"),
                      help="how long each task sleeps")
    demo.add_argument("--concurrency", type=int, default=_default(DemoConfig, "concurrency"),
                      help="slots per worker process")
    demo.add_argument("--tasks-per-worker", type=int, default=None, metavar="N",
                      help="ready tasks per worker the scaling aims for (default: --concurrency)")
    demo.add_argument("--min-workers", type=int, default=_default(DemoConfig, "min_workers"), metavar="N",
                      help="fewest worker processes")
    demo.add_argument("--max-workers", type=int, default=_default(DemoConfig, "max_workers"), metavar="N",
                      help="most worker processes")
    demo.add_argument("--interval", type=float, default=_default(DemoConfig, "interval"),
                      help="seconds between scaling decisions")
    demo.add_argument("--scale-down-window", type=float, default=_default(DemoConfig, "scale_down_window"),
                      help="scale-down stabilization, seconds")
    demo.add_argument("--cooldown", type=float, default=_default(DemoConfig, "cooldown"),
                      help="idle seconds before scaling to zero")
    demo.add_argument("--drain-seconds", type=float, default=_default(DemoConfig, "drain_seconds"), metavar="SECONDS",
                      help="how long a removed worker may finish its tasks")
    demo.add_argument("--timeout", type=float, default=None, help="give up (exit 1) after this many seconds")
    demo.add_argument("--dsn", default=None, help="use this Postgres instead of a throwaway one")
    demo.add_argument("--no-tty", action="store_true", help="one line per tick instead of a live view")

    console = _command(sub, "console", parents=[common], help="serve the web console (docs/console.md)")
    console.add_argument("--host", default="127.0.0.1", help="address to listen on")
    console.add_argument("--port", type=_bounded_int(1, 65535), default=8080, help="port")
    console.add_argument("--allow-actions", action="store_true",
                         help="offer retry, cancel, pause and resume (needs a token: $QUEUEWORKER_CONSOLE_TOKEN, "
                              "$QUEUEWORKER_CONSOLE_TOKEN_FILE or --token-file)")
    console.add_argument("--token-file", default=None, help="file holding the token (a mounted Secret)")
    console.add_argument("--kubeconfig", default=None,
                         help="read QueueWorkers with this kubeconfig (default: the in-cluster configuration)")
    add_dev_db_parser(sub)
    return parser


def _command(commands: Any, name: str, **options: Any) -> argparse.ArgumentParser:
    """A subcommand whose --help opens with a description (its one-line help, unless given)."""
    summary = options.get("help") or ""
    options.setdefault("description", summary[:1].upper() + summary[1:] + ("." if summary else ""))
    return commands.add_parser(name, **options)


def _add_cron_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """`queueworker cron add|list|pause|resume|delete`: periodic schedules kept in the database."""
    from .client.cron import CATCH_UP
    from .client.producer import TaskSpec

    cron = _command(sub, "cron", help="periodic tasks: add, list, pause, resume, delete schedules")
    commands = cron.add_subparsers(dest="cron_command", required=True, metavar="COMMAND")
    add = _command(commands, "add", parents=[common],
                              help="add (or replace) a schedule kept in the database: no deploy needed")
    add.add_argument("name")
    add.add_argument("--cron", required=True, metavar="EXPR",
                     help='cron expression, e.g. "*/5 * * * *" (a sixth field: seconds)')
    add.add_argument("--task", required=True)
    source = add.add_mutually_exclusive_group()
    source.add_argument("--payload", metavar="JSON", help="JSON payload; - reads it from stdin (default {})")
    source.add_argument("--payload-file", metavar="FILE", help="read the JSON payload from FILE")
    add.add_argument("--queue", help=f"default {_default(TaskSpec, 'queue')}")
    add.add_argument("--timezone", default="UTC", help="IANA time zone of the expression (default UTC)")
    add.add_argument("--catch-up", choices=CATCH_UP, default="none",
                     help="slots missed while no worker ran: skip them (none, default), run the latest, or all")
    add.add_argument("--priority", help=f"default {_default(TaskSpec, 'priority')}")
    add.add_argument("--max-attempts", metavar="N", help=f"default {_default(TaskSpec, 'max_attempts')}")
    listing = _command(commands, "list", parents=[common], help="every schedule, with its next slot")
    listing.add_argument("--json", action="store_true", help="print JSON")
    for command, text in (("pause", "enqueue no more slots of a schedule"),
                          ("resume", "go on from the schedule's next slot after now (paused slots are skipped)"),
                          ("delete", "remove a schedule (one declared in code comes back when a worker declaring "
                                     "it starts)")):
        _command(commands, command, parents=[common], help=text).add_argument("name")


def cmd_cron(args: argparse.Namespace) -> int:
    from .db import sql
    from .client.cron import CronError, cron_job, first_slot_after, schedule_name
    from .db.connection import typed_rows

    if args.cron_command in ("pause", "resume", "delete"):
        try:
            schedule_name(args.name)
        except CronError as exc:
            raise CliError(str(exc)) from None

    with _connect(args.dsn) as conn:
        if args.cron_command == "list":
            with conn.cursor(row_factory=typed_rows(sql.CronJobRow)) as cursor:
                rows = cursor.execute(sql.CRON_JOBS).fetchall()
            if args.json:
                print(json.dumps([_cron_job_as_json(row) for row in rows], indent=2, default=str))
                return 0
            Column = status.Column
            print("\n".join(status.table(
                [Column("NAME", flexible=True), Column("SCHEDULE"), Column("TIMEZONE"), Column("TASK", flexible=True),
                 Column("SOURCE"), Column("STATE"), Column("NEXT (UTC)")],  # queues and payloads: --json
                [[row.name, row.expression, row.timezone, row.task, row.source,
                  "paused" if row.paused else "active", f"{row.next_slot.astimezone(UTC):%m-%d %H:%M:%S}"]
                 for row in rows])) if rows else "(no schedules)")
            return 0
        if args.cron_command == "add":
            given = {"queue": args.queue, "priority": args.priority, "max_attempts": args.max_attempts}
            try:
                job = cron_job(args.name, args.cron, args.task, _payload(args).get("payload"), timezone=args.timezone,
                               catch_up=args.catch_up, **{k: v for k, v in given.items() if v is not None})
            except CronError as exc:
                raise CliError(str(exc)) from None
            except ValidationError as exc:
                raise CliError(one_line(exc, {**ENQUEUE_LABELS, "task": "--task"})) from None
            (now,), = conn.execute(sql.DATABASE_NOW).fetchall()
            changed = conn.execute(sql.UPSERT_RUNTIME_CRON_JOB,
                                   job.params(first_slot_after(job.expression, job.timezone, now))).fetchall()
            if changed:
                print(f"schedule {job.name}: {'added' if changed[0][0] else 'replaced'}")
            elif conn.execute(sql.CRON_JOB_SOURCE, {"name": job.name}).fetchall() == [("code",)]:
                raise CliError(f"schedule {job.name!r} is declared in code: change it there, or give this one "
                               "another name")
            else:
                print(f"schedule {job.name}: unchanged")
            return 0
        with conn.cursor() as cursor:
            if args.cron_command == "resume":
                with conn.cursor(row_factory=typed_rows(sql.CronScheduleRow)) as locked:
                    schedule = locked.execute(sql.CRON_SCHEDULE_FOR_UPDATE, {"name": args.name}).fetchone()
                if schedule is None:
                    raise CliError(f"no schedule named {args.name[:200]!r}")
                try:
                    next_slot = first_slot_after(schedule.expression, schedule.timezone, schedule.now)
                except CronError as exc:
                    raise CliError(f"schedule {args.name!r} cannot be resumed: {exc}") from None
                if cursor.execute(sql.RESUME_CRON_JOB, {"name": args.name, "next_slot": next_slot}).fetchall():
                    print(f"schedule {args.name}: resumed, next slot {next_slot:%Y-%m-%d %H:%M:%S%z}")
                else:
                    print(f"schedule {args.name}: not paused, nothing changed")
                return 0
            statement = {"pause": sql.PAUSE_CRON_JOB, "delete": sql.DELETE_CRON_JOB}[args.cron_command]
            if not cursor.execute(statement, {"name": args.name}).fetchall():
                raise CliError(f"no schedule named {args.name[:200]!r}")
        print(f"schedule {args.name}: {'paused' if args.cron_command == 'pause' else 'deleted'}")
    return 0


def _cron_job_as_json(row: Any) -> dict[str, Any]:
    """A schedule for `cron list --json`, its payload as a JSON value."""
    fields = row._asdict()
    fields["payload"] = jsonvalue.decode(fields.pop("payload_json"))
    return fields


def _metavar(option: SettingOption) -> str:
    field = option.field
    if field.endswith("_seconds"):
        return "SECONDS" if option.scale == 1.0 else "HOURS"
    for suffix in ("port", "address", "bytes"):
        if field.endswith(f"_{suffix}"):
            return suffix.upper()
    if option.is_list:
        return "QUEUE" if field == "queues" else "NAME"
    return "N"


def _setting_help(option: SettingOption) -> str:
    """The field's description, its default in the flag's unit, and its variable."""
    description = WorkerSettings.model_fields[option.field].description or ""
    default = option.default_text
    repeat = "; repeatable" if option.is_list else ""
    text = f"{description}{repeat} ({'default: ' + default + '; ' if default is not None else ''}${option.env})"
    return text.replace("%", "%%")


def _database_url(args: argparse.Namespace) -> str:
    """The database URL from --dsn or $DATABASE_URL, validated before anything uses it."""
    url, source = (args.dsn, "--dsn") if args.dsn else (os.environ.get("DATABASE_URL"), "DATABASE_URL")
    if not url:
        raise CliError("no database: pass --dsn or set DATABASE_URL")
    try:
        dsns.validate(url)
    except dsns.InvalidDsn as exc:
        raise CliError(f"{source}: {exc}") from None
    return url


def _secrets(url: str | None) -> list[str]:
    """What must never be printed: the URL itself, its password, and libpq's $PGPASSWORD."""
    if not url:
        return []
    return [url, dsns.parse(url).get("password"), os.environ.get("PGPASSWORD")]  # type: ignore[list-item]


def _connect(url: str) -> psycopg.Connection:
    from .db.connection import NEVER_PREPARE
    return psycopg.connect(url, application_name="queueworker-cli", connect_timeout=CONNECT_TIMEOUT_SECONDS,
                           **NEVER_PREPARE)


def cmd_migrate(args: argparse.Namespace) -> int:
    from .db.migrate import latest_version, migrate

    applied = migrate(args.dsn)
    names = ", ".join(f"{m.version:03d}_{m.name}" for m in applied) or "nothing to apply"
    print(f"schema at version {latest_version()} ({names})")
    return 0


def _payload(args: argparse.Namespace) -> dict[str, Any]:
    """{"payload": value} from --payload, stdin (--payload -) or --payload-file; {} for the default."""
    if args.payload_file is not None:
        label = f"--payload-file {args.payload_file!r}"
        try:
            text = Path(args.payload_file).read_bytes().decode("utf-8")
        except OSError as exc:
            raise CliError(f"cannot read {label}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise CliError(f"{label} is not UTF-8 text") from None
    elif args.payload == "-":
        label = "the payload on stdin"
        if sys.stdin is None:
            raise CliError(f"cannot read {label}: stdin is closed")
        try:
            text = sys.stdin.buffer.read().decode("utf-8")
        except OSError as exc:
            raise CliError(f"cannot read {label}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise CliError(f"{label} is not UTF-8 text") from None
    elif args.payload is not None:
        label, text = "--payload", args.payload
    else:
        return {}
    try:
        return {"payload": jsonvalue.decode(text)}
    except jsonvalue.Undecodable as exc:
        raise CliError(f"{label}: {exc}") from None


def cmd_enqueue(args: argparse.Namespace) -> int:
    from .client.producer import BATCH_SIZE, COPY_BATCH_SIZE, TaskSpec, enqueue_batch

    given = {"task": args.task, "queue": args.queue, "priority": args.priority, "delay": args.delay,
             "max_attempts": args.max_attempts, "timeout_seconds": args.timeout, "dedupe_key": args.dedupe_key,
             "dedupe": "spec" if args.dedupe_spec else None, "on_conflict": args.on_conflict,
             "depends_on": args.after or None, "on_dependency_failure": args.on_dependency_failure,
             "notify_on_finish": args.notify_on_finish or None, "headers": dict(args.header) or None}
    try:
        spec = TaskSpec(**{k: v for k, v in given.items() if v is not None}, **_payload(args))
    except ValidationError as exc:
        raise CliError(one_line(exc, ENQUEUE_LABELS)) from None
    if spec.unique and args.count > 1:
        raise CliError("--count: copies of a unique task would all be the same task; give --count 1")
    ids: list[int] = []
    batch_size = COPY_BATCH_SIZE if spec.plain else BATCH_SIZE
    with _connect(args.dsn) as conn:
        for start in range(0, args.count, batch_size):
            outcome = enqueue_batch(conn, [spec] * min(batch_size, args.count - start))
            ids.extend(outcome.ids)
    held = len(ids) == 1 and outcome.duplicates
    if held:
        replaced = " (replaced its payload, priority and schedule if still pending)" \
            if spec.on_conflict == "replace" else ""
        print(f"queueworker: the key is already held by task {ids[0]}: nothing enqueued{replaced}", file=sys.stderr)
    if args.quiet:
        print("\n".join(map(str, ids)))
    elif len(ids) == 1:
        print(f"{'task' if held else 'enqueued task'} {ids[0]} ({spec.task}) on queue {spec.queue}")
    else:
        print(f"enqueued {len(ids)} tasks (ids {ids[0]}..{ids[-1]}) on queue {spec.queue}")
    return 0


def _process_option(given: str | None, flag: str, env: str, choices: tuple[str, ...], default: str) -> str:
    """A flag, else its environment variable, else the default; checked against `choices`."""
    value, source = (given, flag) if given is not None else (os.environ.get(env, "").strip().lower(), env)
    if not value:
        return default
    if value not in choices:
        raise CliError(f"{source}: must be one of {', '.join(choices)}")
    return value


def cmd_worker(args: argparse.Namespace) -> int:
    from .runtime.external import register_commands
    from .runtime.handlers import default_registry
    from .settings import settings_from
    from .runtime.worker import run_worker

    level = _process_option(args.log_level, "--log-level", "QUEUEWORKER_LOG_LEVEL", LEVELS, "info")
    log_format = _process_option(args.log_format, "--log-format", "QUEUEWORKER_LOG_FORMAT", LOG_FORMATS,
                                 default_format())
    settings = settings_from({option.field: getattr(args, option.field) for option in SETTING_OPTIONS}, os.environ)
    configure_logging(level, log_format == "json", _secrets(args.dsn))
    processes = args.processes if args.processes is not None else _processes_from_environment()
    if processes > 1:
        from .runtime.processes import run_processes

        return run_processes(args.argv, processes, settings.metrics_port)
    _import_from_working_directory()
    try:
        default_registry.import_modules(args.handlers)
        register_commands(default_registry, args.commands, settings)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        try:
            start_http_server(settings.metrics_port, addr=settings.metrics_address)
        except OSError as exc:
            raise CliError(f"cannot serve metrics on {settings.metrics_address} port {settings.metrics_port}: "
                           f"{exc.strerror or exc}") from None
    # Threads of sync handlers that ignored cancellation are daemons: they cannot hold up the exit.
    return run_worker(args.dsn, settings, default_registry, auto_migrate=args.migrate, install_signal_handlers=True)


def _processes_from_environment() -> int:
    text = os.environ.get("QUEUEWORKER_PROCESSES", "").strip()
    if not text:
        return 1
    try:
        return _bounded_int(1, MAX_PROCESSES)(text)
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"QUEUEWORKER_PROCESSES: {exc}") from None


def _import_from_working_directory() -> None:
    """`--handlers app.tasks` finds `app` in the working directory, as `python -m` would: the
    script's own directory (the virtualenv's bin/) is what the interpreter put on the path."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def cmd_status(args: argparse.Namespace) -> int:
    with _connect(args.dsn) as conn:
        report = status.collect(conn, args.queue, stuck=args.stuck)
    print(json.dumps(report, indent=2, default=str) if args.json else status.render(report))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from .db import sql
    from .db.connection import typed_rows

    with _connect(args.dsn) as conn, conn.cursor(row_factory=typed_rows(sql.ListedTaskRow)) as cursor:
        rows = cursor.execute(sql.LIST_TASKS, {"queue": args.queue, "state": args.state,
                                               "limit": args.limit}).fetchall()
    if args.json:
        print(json.dumps([row._asdict() for row in rows], indent=2, default=str))
        return 0
    Column = status.Column
    print("\n".join(status.table(
        [Column("ID", right=True), Column("QUEUE"), Column("TASK"), Column("STATE"), Column("ATTEMPTS", right=True),
         Column("PROGRESS", flexible=True)],
        [[row.id, row.queue, row.task, row.state, f"{row.attempts}/{row.max_attempts}",
          status.describe_progress(row.progress_json)] for row in rows])) if rows else "(no tasks)")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    from .client.operations import RetryRefused, retry

    with _connect(args.dsn) as conn:
        try:
            row = retry(conn, args.id)
        except RetryRefused as exc:
            raise CliError(str(exc)) from None
        conn.commit()
    print(f"task {row.id} is pending again on queue {row.queue} (attempts so far {row.attempts}, "
          f"max {row.max_attempts})")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from .db import sql
    from .db.connection import typed_rows
    from .client.operations import cancel_many

    if bool(args.ids) == bool(args.queue):
        raise CliError("give task ids or --queue, not both")
    with _connect(args.dsn) as conn:
        try:
            rows = cancel_many(conn, ids=args.ids or None, queue=args.queue, reason=args.reason,
                               states=args.states or CANCELLABLE)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        conn.commit()
        if args.queue:
            print(f"{len(rows)} tasks of queue {args.queue} cancelled")
            return 0
        for row in rows:
            print(f"task {row.id} cancelled (was {row.was})")
        missed = [task_id for task_id in dict.fromkeys(args.ids) if task_id not in {row.id for row in rows}]
        if missed:
            with conn.cursor(row_factory=typed_rows(sql.TaskStateRow)) as cursor:
                states = {row.id: row.state for row in cursor.execute(sql.TASK_STATES, {"ids": missed})}
            raise CliError("; ".join(f"task {task_id} is {states[task_id]}" if task_id in states
                                     else f"no task with id {task_id}" for task_id in missed)
                           + f": only {', '.join(args.states or CANCELLABLE)} tasks can be cancelled")
    return 0


def cmd_flow(args: argparse.Namespace) -> int:
    """pause, resume, limit and breaker: change a queue's flow control, then print it."""
    from .client import operations
    from .client.status import flow_control

    with _connect(args.dsn) as conn:
        try:
            if args.subcommand == "pause":
                row = operations.pause(conn, args.queue, seconds=args.duration and operations.parse_duration(
                    args.duration))
            elif args.subcommand == "resume":
                row = operations.resume(conn, args.queue)
            elif args.subcommand == "limit":
                if args.clear == bool(args.rate or args.concurrency or args.burst):
                    raise CliError("give --rate and/or --concurrency, or --clear")
                row = operations.set_limits(conn, args.queue, burst=args.burst, max_running=args.concurrency,
                                            rate_per_second=args.rate and operations.parse_rate(args.rate))
            else:
                if args.off == bool(args.failures or args.cooldown):
                    raise CliError("give --failures and --cooldown, or --off")
                row = operations.set_breaker(conn, args.queue, failures=args.failures,
                                             cooldown_seconds=args.cooldown and operations.parse_duration(
                                                 args.cooldown))
        except ValidationError as exc:
            raise CliError(one_line(exc, {"": "queue"})) from None
        except ValueError as exc:
            raise CliError(str(exc)) from None
        conn.commit()
    if row is None:
        print(f"queue {args.queue} has no flow control")
    else:
        print(f"queue {args.queue}: " + status.describe_flow(flow_control(row)))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """The JSON columns are printed as Postgres holds them (shortened where long), so a value Python
    could not read is still shown."""
    from .db import sql
    from .db.connection import typed_rows

    with _connect(args.dsn) as conn:
        with conn.cursor(row_factory=typed_rows(sql.TaskRow)) as cursor:
            task = cursor.execute(sql.TASK, {"id": args.id}).fetchone()
        if task is None:
            raise CliError(f"no task with id {args.id} (never enqueued, or deleted after the retention period)")
        with conn.cursor(row_factory=typed_rows(sql.TaskEventRow)) as cursor:
            events = cursor.execute(sql.TASK_EVENTS, {"id": args.id}).fetchall()
    if args.json:
        print(json.dumps({**task._asdict(), "events": [event._asdict() for event in events]}, indent=2,
                         default=str))
        return 0
    print(f"task {task.id} {task.task} on queue {task.queue}: {task.state}, attempt {task.attempts} of "
          f"{task.max_attempts}, priority {task.priority}")
    for label, value in (("dedupe key", task.dedupe_key), ("run", task.run_id and (
            f"{task.run_id}" + ("" if task.run_partition is None else f" partition {task.run_partition}"))),
            ("continued from", task.continued_from), ("created", task.created_at), ("due", task.run_after),
            ("started", task.started_at), ("finished", task.finished_at)):
        if value is not None:
            print(f"  {label + ':':<15} {value}")
    for label, text in (("progress", task.progress_json), ("payload", task.payload_json),
                        ("result", task.result_json), ("error", task.error_json),
                        ("checkpoint", task.checkpoint_json)):
        if text is not None:
            print(f"  {label + ':':<15} {_shorten(text, 500)}")
    print("events:")
    for event in events:
        print(f"  {event.at:%Y-%m-%d %H:%M:%S.%f} {event.from_state or 'enqueued':<9} -> {event.to_state:<9} "
              f"token {event.lease_token} {event.worker or ''} {_shorten(event.detail_json or '', 300)}".rstrip())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .dev.demo import DemoConfig, run_demo
    from .dev.localpg import PostgresNotFound

    try:
        config = DemoConfig.model_validate(vars(args))
    except ValidationError as exc:
        raise CliError(one_line(exc, {field: "--" + field.replace("_", "-") for field in vars(args)})) from None
    try:
        return run_demo(config)
    except PostgresNotFound as exc:
        raise CliError(str(exc)) from None


def cmd_runs(args: argparse.Namespace) -> int:
    from .db import sql
    from .db.connection import typed_rows

    with _connect(args.dsn) as conn, conn.cursor(row_factory=typed_rows(sql.RunRow)) as cursor:
        rows = cursor.execute(sql.RUNS, {"name": args.name, "limit": args.limit}).fetchall()
    if args.json:
        print(json.dumps([_run_as_json(row) for row in rows], indent=2, default=str))
        return 0
    print(f"{'ID':>8} {'NAME':<24} {'STATE':<10} {'SUCCEEDED':>10} {'FAILED':>7} {'CANCELLED':>10} {'EXPECTED':>9}")
    for row in rows:
        print(f"{row.id:>8} {row.name[:24]:<24} {row.state:<10} {row.succeeded:>10} {row.failed:>7} "
              f"{row.cancelled:>10} {row.expected:>9}")
    return 0


def _shorten(text: str, limit: int = 200) -> str:
    """A value shown on one line of a listing: a watermark written by hand may be of any size."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _run_as_json(row) -> dict[str, Any]:
    """A run for `runs --json`, its watermarks as JSON values; one Python cannot read (written by
    hand, nested too deeply) stays the JSON text Postgres holds, under a key that says so."""
    from . import jsonvalue

    fields = row._asdict()
    for key in ("watermark_before", "watermark_after"):
        text = fields.pop(f"{key}_json")
        try:
            fields[key] = None if text is None else jsonvalue.decode(text)
        except jsonvalue.Undecodable:
            fields[f"{key}_json"] = text
    return fields


def cmd_run(args: argparse.Namespace) -> int:
    from .db import sql
    from .db.connection import typed_rows
    from .client.producer import start_run

    with _connect(args.dsn) as conn:
        if args.run_command == "start":
            queue = {"queue": args.queue} if args.queue else {}
            try:
                run_id = start_run(conn, args.name, [{"task": args.task, "payload": {"partition": i}, **queue}
                                                     for i in range(args.partitions)],
                                   on_success={"task": args.on_success, **queue} if args.on_success else None,
                                   on_failure={"task": args.on_failure, **queue} if args.on_failure else None,
                                   watermark=args.watermark)
            except ValueError as exc:
                raise CliError(str(exc)) from None
            print(run_id)
            return 0
        with conn.cursor(row_factory=typed_rows(sql.RunRow)) as cursor:
            run = cursor.execute(sql.RUN, {"id": args.id}).fetchone()
        if run is None:
            raise CliError(f"no run with id {args.id}")
        if args.run_command == "show":
            print(f"run {run.id} {run.name}: {run.state}, {run.succeeded} succeeded, {run.failed} failed, "
                  f"{run.cancelled} cancelled of {run.expected}; watermark {run.watermark or '-'} "
                  f"(before {_shorten(run.watermark_before_json or 'null')}, "
                  f"after {_shorten(run.watermark_after_json or 'null')})")
            with conn.cursor(row_factory=typed_rows(sql.RunTaskRow)) as cursor:
                for task in cursor.execute(sql.RUN_TASKS, {"id": run.id}):
                    role = (f"partition {task.partition}" if task.partition is not None
                            else "consolidation" if task.id == run.success_task_id else "alert")
                    print(f"  {role:<16} task {task.id:<8} {task.state:<10} attempts {task.attempts}"
                          + (f"  {task.error}" if task.error else ""))
            print("events:")
            with conn.cursor(row_factory=typed_rows(sql.RunEventRow)) as cursor:
                for event in cursor.execute(sql.RUN_EVENTS, {"id": run.id}):
                    print(f"  {event.at:%Y-%m-%d %H:%M:%S} {event.from_state or 'started':<9} -> "
                          f"{event.to_state:<9} by {event.by_user}  {event.detail_json}")
        elif args.run_command == "retry":
            with conn.cursor(row_factory=typed_rows(sql.RetriedRunRow)) as cursor:
                retried = cursor.execute(sql.RETRY_RUN, {"id": run.id}).fetchone().retried
            print(f"run {run.id}: {retried} partitions pending again")
        else:
            with conn.cursor(row_factory=typed_rows(sql.FinalizedRunRow)) as cursor:
                if not cursor.execute(sql.FINALIZE_RUN, {"id": run.id}).fetchone().finalized:
                    raise CliError(f"run {run.id} is {run.state}: only a failed run that has not been consolidated "
                                   "can be finalized")
            print(f"run {run.id}: finalized; the consolidation is enqueued once every partition has ended")
    return 0


def cmd_console(args: argparse.Namespace) -> int:
    """Serves the console until interrupted; refuses --allow-actions without a token."""
    try:
        import uvicorn

        from .console import ConsoleConfig, CredentialsError, create_app, load_token
    except ImportError as exc:
        raise CliError(f"the console needs its extra: pip install 'queueworker[console]' ({exc})") from None
    try:
        config = ConsoleConfig(args.dsn, token=load_token(args.token_file), allow_actions=args.allow_actions,
                               kubeconfig=args.kubeconfig)
    except CredentialsError as exc:
        raise CliError(str(exc)) from None
    configure_logging("INFO", json_format=default_format() == "json", secrets=[*_secrets(args.dsn), config.token])
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again under the handler it
    # found: a handler that does nothing makes that graceful stop exit 0, as a pod's stop should.
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_config=None, proxy_headers=False,
                server_header=False)
    return 0


COMMANDS = {"migrate": cmd_migrate, "enqueue": cmd_enqueue, "worker": cmd_worker, "status": cmd_status,
            "retry": cmd_retry, "cancel": cmd_cancel, "show": cmd_show, "demo": cmd_demo, "runs": cmd_runs,
            "run": cmd_run, "cron": cmd_cron, "list": cmd_list, "pause": cmd_flow, "resume": cmd_flow,
            "limit": cmd_flow, "breaker": cmd_flow, "dev-db": run_dev_db,
            "console": cmd_console}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `worker --processes` starts its workers with
    url: str | None = None
    try:
        # The demo starts its own database; dev-db is one.
        if args.subcommand not in ("demo", "dev-db") or getattr(args, "dsn", None) is not None:
            args.dsn = url = _database_url(args)
        return COMMANDS[args.subcommand](args)
    except (CliError, SettingsError) as exc:
        return _fail(str(exc), EXIT_USAGE, url)
    except ValidationError as exc:
        return _fail(f"invalid input: {one_line(exc)}", EXIT_USAGE, url)
    except SCHEMA_MISSING as exc:
        return _fail(f"database error: {dsns.explain(exc, url)}: the queueworker schema is missing or older than "
                     f"this version ({__version__}) needs: run `queueworker migrate` first", EXIT_FAILURE, url)
    except psycopg.Error as exc:
        return _fail(f"database error: {dsns.explain(exc, url)}", EXIT_FAILURE, url)
    except ImportError as exc:
        return _fail(str(exc), EXIT_USAGE, url)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - a bug: keep its traceback, but never a secret in it
        print(dsns.scrub("".join(traceback.format_exception(exc)), _secrets(url)), file=sys.stderr, end="")
        return _fail(f"internal error: {type(exc).__name__}", EXIT_FAILURE, url)


def _fail(message: str, code: int, url: str | None) -> int:
    print(f"queueworker: {dsns.scrub(message, _secrets(url))}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""`queueworker cron add|list|pause|resume|delete`: periodic schedules kept in the database
(docs/cron.md). The work is done by queueworker.client.cron; here the arguments are read and the
outcome printed."""

from __future__ import annotations

import argparse
import json
from datetime import UTC
from typing import Any

from pydantic import ValidationError

from .. import jsonvalue
from ..client import cron
from ..client.producer import TaskSpec
from ..db.cron import CronJobRow
from ..settings import one_line
from .common import ENQUEUE_LABELS, CliError, command, connect, default, payload
from .tables import Column, table


def add_cron(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = command(sub, "cron", help="periodic tasks: add, list, pause, resume, delete schedules")
    commands = parser.add_subparsers(dest="cron_command", required=True, metavar="COMMAND")
    add = command(commands, "add", parents=[common],
                  help="add (or replace) a schedule kept in the database: no deploy needed")
    add.add_argument("name")
    add.add_argument("--cron", required=True, metavar="EXPR",
                     help='cron expression, e.g. "*/5 * * * *" (a sixth field: seconds)')
    add.add_argument("--task", required=True)
    source = add.add_mutually_exclusive_group()
    source.add_argument("--payload", metavar="JSON", help="JSON payload; - reads it from stdin (default {})")
    source.add_argument("--payload-file", metavar="FILE", help="read the JSON payload from FILE")
    add.add_argument("--queue", help=f"default {default(TaskSpec, 'queue')}")
    add.add_argument("--timezone", default="UTC", help="IANA time zone of the expression (default UTC)")
    add.add_argument("--catch-up", choices=cron.CATCH_UP, default="none",
                     help="slots missed while no worker ran: skip them (none, default), run the latest, or all")
    add.add_argument("--priority", help=f"default {default(TaskSpec, 'priority')}")
    add.add_argument("--max-attempts", metavar="N", help=f"default {default(TaskSpec, 'max_attempts')}")
    add.add_argument("--key", metavar="K", help="the task key of every slot (printable text, 1 to 256 characters)")
    listing = command(commands, "list", parents=[common], help="every schedule, with its next slot")
    listing.add_argument("--json", action="store_true", help="print JSON")
    for name, text in (("pause", "enqueue no more slots of a schedule"),
                       ("resume", "go on from the schedule's next slot after now (paused slots are skipped)"),
                       ("delete", "remove a schedule (one declared in code comes back when a worker declaring "
                                  "it starts)")):
        command(commands, name, parents=[common], help=text).add_argument("name")


def cmd_cron(args: argparse.Namespace) -> int:
    if args.cron_command in ("pause", "resume", "delete"):
        try:
            cron.schedule_name(args.name)  # before connecting: a bad name needs no database
        except cron.CronError as exc:
            raise CliError(str(exc)) from None
    with connect(args.dsn) as conn:
        if args.cron_command == "list":
            _print_schedules(cron.schedules(conn), as_json=args.json)
            return 0
        try:
            if args.cron_command == "add":
                job = _job(args)
                print(f"schedule {job.name}: {cron.add_schedule(conn, job)}")
            elif args.cron_command == "resume":
                next_slot = cron.resume_schedule(conn, args.name)
                print(f"schedule {args.name}: not paused, nothing changed" if next_slot is None
                      else f"schedule {args.name}: resumed, next slot {next_slot:%Y-%m-%d %H:%M:%S%z}")
            elif args.cron_command == "pause":
                cron.pause_schedule(conn, args.name)
                print(f"schedule {args.name}: paused")
            else:
                cron.delete_schedule(conn, args.name)
                print(f"schedule {args.name}: deleted")
        except cron.CronError as exc:
            raise CliError(str(exc)) from None
    return 0


def _job(args: argparse.Namespace) -> cron.CronJob:
    """The schedule `cron add` was given, checked (CronError for the schedule itself)."""
    given = {"queue": args.queue, "priority": args.priority, "max_attempts": args.max_attempts, "key": args.key}
    try:
        return cron.cron_job(args.name, args.cron, args.task, payload(args).get("payload"), timezone=args.timezone,
                        catch_up=args.catch_up, **{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise CliError(one_line(exc, {**ENQUEUE_LABELS, "task": "--task"})) from None


def _print_schedules(rows: list[CronJobRow], as_json: bool) -> None:
    if as_json:
        print(json.dumps([_cron_job_as_json(row) for row in rows], indent=2, default=str))
        return
    print("\n".join(table(
        [Column("NAME", flexible=True), Column("SCHEDULE"), Column("TIMEZONE"), Column("TASK", flexible=True),
         Column("SOURCE"), Column("STATE"), Column("NEXT (UTC)")],  # queues and payloads: --json
        [[row.name, row.expression, row.timezone, row.task, row.source,
          "paused" if row.paused else "active", f"{row.next_slot.astimezone(UTC):%m-%d %H:%M:%S}"]
         for row in rows])) if rows else "(no schedules)")


def _cron_job_as_json(row: CronJobRow) -> dict[str, Any]:
    """A schedule for `cron list --json`, its payload as a JSON value."""
    fields = row._asdict()
    fields["payload"] = jsonvalue.decode(fields.pop("payload_json"))
    return fields

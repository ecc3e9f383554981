"""`queueworker runs` and `queueworker run start|show|retry|finalize`: partitioned runs. The work is
done by queueworker.client (`start_run`, queueworker.client.runs); here the arguments are read and
the outcome printed."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import jsonvalue
from ..client import runs
from ..client.producer import TaskSpec, start_run
from ..db.runs import RunRow
from .common import BIGINT_MAX, MAX_COUNT, CliError, bounded_int, command, connect, default, shorten


def add_runs(sub: Any, common: argparse.ArgumentParser) -> None:
    listing = command(sub, "runs", parents=[common], help="partitioned runs, newest first")
    listing.add_argument("--name", default=None, help="only runs of this name")
    listing.add_argument("--limit", type=bounded_int(1, 10_000), default=20, metavar="N", help="at most N runs")
    listing.add_argument("--json", action="store_true", help="print JSON")


def cmd_runs(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
        rows = runs.runs(conn, name=args.name, limit=args.limit)
    if args.json:
        print(json.dumps([_run_as_json(row) for row in rows], indent=2, default=str))
        return 0
    print(f"{'ID':>8} {'NAME':<24} {'STATE':<10} {'SUCCEEDED':>10} {'FAILED':>7} {'CANCELLED':>10} {'EXPECTED':>9}")
    for row in rows:
        print(f"{row.id:>8} {row.name[:24]:<24} {row.state:<10} {row.succeeded:>10} {row.failed:>7} "
              f"{row.cancelled:>10} {row.expected:>9}")
    return 0


def _run_as_json(row: RunRow) -> dict[str, Any]:
    """A run for `runs --json`, its watermarks as JSON values; one Python cannot read (written by
    hand, nested too deeply) stays the JSON text Postgres holds, under a key that says so."""
    fields = row._asdict()
    for key in ("watermark_before", "watermark_after"):
        text = fields.pop(f"{key}_json")
        try:
            fields[key] = None if text is None else jsonvalue.decode(text)
        except jsonvalue.Undecodable:
            fields[f"{key}_json"] = text
    return fields


def add_run(sub: Any, common: argparse.ArgumentParser) -> None:
    run = command(sub, "run", help="start, show, retry or finalize a partitioned run")
    run_commands = run.add_subparsers(dest="run_command", required=True, metavar="COMMAND")
    run_start = command(run_commands, "start", parents=[common],
                        help="start a run of N partitions of TASK (payload {\"partition\": i})")
    run_start.add_argument("name")
    run_start.add_argument("--task", required=True)
    run_start.add_argument("--partitions", type=bounded_int(1, MAX_COUNT), required=True)
    run_start.add_argument("--queue", help=f"the partitions' queue (default: {default(TaskSpec, 'queue')})")
    run_start.add_argument("--on-success", metavar="TASK", help="the consolidation, enqueued once all succeeded")
    run_start.add_argument("--on-failure", metavar="TASK", help="the alert, enqueued once if a partition fails")
    run_start.add_argument("--watermark", metavar="NAME", help="advanced to the run's start when it succeeds")
    for name, text in (("show", "the run and each partition's state"),
                       ("retry", "retry the run's failed and cancelled partitions")):
        command(run_commands, name, parents=[common], help=text).add_argument("id", type=bounded_int(1, BIGINT_MAX))
    finalize = command(run_commands, "finalize", parents=[common],
                       help="consolidate a failed run on purpose (needs --force)")
    finalize.add_argument("id", type=bounded_int(1, BIGINT_MAX))
    finalize.add_argument("--force", action="store_true", required=True)


def cmd_run(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
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
        run = runs.run(conn, args.id)
        if run is None:
            raise CliError(f"no run with id {args.id}")
        if args.run_command == "show":
            print(f"run {run.id} {run.name}: {run.state}, {run.succeeded} succeeded, {run.failed} failed, "
                  f"{run.cancelled} cancelled of {run.expected}; watermark {run.watermark or '-'} "
                  f"(before {shorten(run.watermark_before_json or 'null')}, "
                  f"after {shorten(run.watermark_after_json or 'null')})")
            for task in runs.run_tasks(conn, run.id):
                role = (f"partition {task.partition}" if task.partition is not None
                        else "consolidation" if task.id == run.success_task_id else "alert")
                print(f"  {role:<16} task {task.id:<8} {task.state:<10} attempts {task.attempts}"
                      + (f"  {task.error}" if task.error else ""))
            print("events:")
            for event in runs.run_events(conn, run.id):
                print(f"  {event.at:%Y-%m-%d %H:%M:%S} {event.from_state or 'started':<9} -> "
                      f"{event.to_state:<9} by {event.by_user}  {event.detail_json}")
        elif args.run_command == "retry":
            print(f"run {run.id}: {runs.retry_run(conn, run.id)} partitions pending again")
        elif not runs.finalize_run(conn, run.id):
            raise CliError(f"run {run.id} is {run.state}: only a failed run that has not been consolidated "
                           "can be finalized")
        else:
            print(f"run {run.id}: finalized; the consolidation is enqueued once every partition has ended")
    return 0

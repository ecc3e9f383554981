"""`queueworker enqueue`, `list`, `show`, `retry` and `cancel`: tasks, one at a time or by the
thousand. The work is done by queueworker.client; here the arguments are read and the outcome
printed."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError

from ..client.inspect import list_tasks, task, task_events, task_states
from ..client.operations import CANCELLABLE, RetryRefused, cancel_many, retry
from ..client.producer import BATCH_SIZE, COPY_BATCH_SIZE, TaskSpec, enqueue_batch
from ..client.status import STATES, describe_progress
from ..settings import one_line
from .common import (
    BIGINT_MAX, ENQUEUE_LABELS, MAX_COUNT, CliError, bounded_int, command, connect, default, payload, shorten)
from .tables import Column, table, terminal_text


def _header(text: str) -> tuple[str, str]:
    """KEY=VALUE of --header; the value may contain `=` (TaskSpec checks both)."""
    name, equals, value = text.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text[:40]!r}")
    return name, value


def add_enqueue(sub: Any, common: argparse.ArgumentParser) -> None:
    enq = command(sub, "enqueue", parents=[common], help="enqueue tasks")
    enq.add_argument("task", help="task name, e.g. qw.sleep")
    source = enq.add_mutually_exclusive_group()
    source.add_argument("--payload", metavar="JSON", help="JSON payload; - reads it from stdin (default: {})")
    source.add_argument("--payload-file", metavar="FILE", help="read the JSON payload from FILE")
    enq.add_argument("--queue", help=f"the queue to add to (default: {default(TaskSpec, 'queue')})")
    enq.add_argument("--priority", metavar="N",
                     help=f"higher runs first (default: {default(TaskSpec, 'priority')})")
    enq.add_argument("--delay", metavar="SECONDS", help="seconds before the task may run")
    enq.add_argument("--max-attempts", metavar="N",
                     help=f"attempts before the task fails for good (default: {default(TaskSpec, 'max_attempts')})")
    enq.add_argument("--timeout", metavar="SECONDS", help="hard deadline per attempt, whole seconds "
                                                          "(default: the worker's --task-timeout)")
    enq.add_argument("--count", type=bounded_int(1, MAX_COUNT), default=1, metavar="N", help="enqueue this many copies")
    enq.add_argument("-q", "--quiet", action="store_true",
                     help="print only the task ids, one per line (for scripts: id=$(queueworker enqueue -q ...))")
    unique = enq.add_mutually_exclusive_group()
    unique.add_argument("--dedupe-key", metavar="KEY",
                        help="enqueue nothing while an unfinished task of the queue holds KEY (prints its id)")
    unique.add_argument("--dedupe-spec", action="store_true",
                        help="the same, with the task's spec hash (queue, task, payload) as the key")
    enq.add_argument("--after", action="append", type=bounded_int(1, BIGINT_MAX), default=[], metavar="ID",
                     help="run only once task ID has succeeded (repeatable); the task waits as `blocked`")
    enq.add_argument("--on-dependency-failure", choices=("cancel", "run"),
                     help="when a task of --after ends failed or cancelled: cancel this one (default) or run it")
    enq.add_argument("--key", metavar="K",
                     help="the task's key: what it belongs to within its queue, e.g. a tenant (printable text, "
                          "1 to 256 characters; docs/flow-control.md)")
    enq.add_argument("--header", action="append", type=_header, default=[], metavar="KEY=VALUE",
                     help="a header stored with the task (repeatable), e.g. traceparent=00-...-01 to continue "
                          "a trace (docs/observability.md)")
    enq.add_argument("--notify-on-finish", action="store_true",
                     help="notify when the task ends, so queueworker.wait_for hears of it at once")
    enq.add_argument("--on-conflict", choices=("ignore", "replace"),
                     help="with a key held by a pending task: leave it (default), or replace its payload, "
                          "priority and schedule")


def cmd_enqueue(args: argparse.Namespace) -> int:
    given = {"task": args.task, "queue": args.queue, "priority": args.priority, "delay": args.delay,
             "max_attempts": args.max_attempts, "timeout_seconds": args.timeout, "dedupe_key": args.dedupe_key,
             "dedupe": "spec" if args.dedupe_spec else None, "on_conflict": args.on_conflict,
             "depends_on": args.after or None, "on_dependency_failure": args.on_dependency_failure,
             "notify_on_finish": args.notify_on_finish or None, "headers": dict(args.header) or None,
             "key": args.key}
    try:
        spec = TaskSpec(**{k: v for k, v in given.items() if v is not None}, **payload(args))
    except ValidationError as exc:
        raise CliError(one_line(exc, ENQUEUE_LABELS)) from None
    if spec.unique and args.count > 1:
        raise CliError("--count: copies of a unique task would all be the same task; give --count 1")
    ids: list[int] = []
    batch_size = COPY_BATCH_SIZE if spec.plain else BATCH_SIZE
    with connect(args.dsn) as conn:
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


def add_list(sub: Any, common: argparse.ArgumentParser) -> None:
    listing = command(sub, "list", parents=[common], help="the newest tasks, by queue and state, with progress")
    listing.add_argument("--queue", default=None, help="only this queue")
    listing.add_argument("--state", choices=STATES, default=None, help="only tasks in this state")
    listing.add_argument("--limit", type=bounded_int(1, 10_000), default=50, metavar="N", help="at most N tasks")
    listing.add_argument("--json", action="store_true", help="print JSON")


def cmd_list(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
        rows = list_tasks(conn, queue=args.queue, state=args.state, limit=args.limit)
    if args.json:
        print(json.dumps([row._asdict() for row in rows], indent=2, default=str))
        return 0
    keys = any(row.key is not None for row in rows)  # the KEY column only where some task has one
    print("\n".join(table(
        [Column("ID", right=True), Column("QUEUE"), Column("TASK"), Column("STATE"), Column("ATTEMPTS", right=True),
         Column("PROGRESS", flexible=True)] + ([Column("KEY", flexible=True)] if keys else []),
        [[row.id, row.queue, row.task, row.state, f"{row.attempts}/{row.max_attempts}",
          describe_progress(row.progress_json)] + ([terminal_text(row.key or "")] if keys else []) for row in rows]))
          if rows else "(no tasks)")
    return 0


def add_retry(sub: Any, common: argparse.ArgumentParser) -> None:
    retry = command(sub, "retry", parents=[common], help="put a failed or cancelled task back to pending")
    retry.add_argument("id", type=bounded_int(1, BIGINT_MAX))


def cmd_retry(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
        try:
            row = retry(conn, args.id)
        except RetryRefused as exc:
            raise CliError(str(exc)) from None
        conn.commit()
    print(f"task {row.id} is pending again on queue {row.queue} (attempts so far {row.attempts}, "
          f"max {row.max_attempts})")
    return 0


def add_cancel(sub: Any, common: argparse.ArgumentParser) -> None:
    cancel = command(sub, "cancel", parents=[common],
                     help="cancel unfinished tasks by id, or every one of a queue (--queue); a running "
                          "task's handler is stopped at once")
    cancel.add_argument("ids", nargs="*", type=bounded_int(1, BIGINT_MAX), metavar="ID")
    cancel.add_argument("--queue", help="cancel the queue's tasks instead of given ids")
    cancel.add_argument("--state", action="append", dest="states", choices=CANCELLABLE,
                        help="only tasks in this state (repeatable; default: all four)")
    cancel.add_argument("--reason", default="cancelled", help="recorded in the task's error and audit trail")


def cmd_cancel(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.queue):
        raise CliError("give task ids or --queue, not both")
    with connect(args.dsn) as conn:
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
            states = task_states(conn, missed)
            raise CliError("; ".join(f"task {task_id} is {states[task_id]}" if task_id in states
                                     else f"no task with id {task_id}" for task_id in missed)
                           + f": only {', '.join(args.states or CANCELLABLE)} tasks can be cancelled")
    return 0


def add_show(sub: Any, common: argparse.ArgumentParser) -> None:
    show = command(sub, "show", parents=[common],
                   help="one task: its state, progress, payload, result or error, and its audit trail")
    show.add_argument("id", type=bounded_int(1, BIGINT_MAX))
    show.add_argument("--json", action="store_true", help="print JSON")


def cmd_show(args: argparse.Namespace) -> int:
    """The JSON columns are printed as Postgres holds them (shortened where long), so a value Python
    could not read is still shown."""
    with connect(args.dsn) as conn:
        found = task(conn, args.id)
        if found is None:
            raise CliError(f"no task with id {args.id} (never enqueued, or deleted after the retention period)")
        events = task_events(conn, args.id)
    if args.json:
        print(json.dumps({**found._asdict(), "events": [event._asdict() for event in events]}, indent=2,
                         default=str))
        return 0
    print(f"task {found.id} {found.task} on queue {found.queue}: {found.state}, attempt {found.attempts} of "
          f"{found.max_attempts}, priority {found.priority}")
    for label, value in (("key", found.key and terminal_text(found.key)), ("dedupe key", found.dedupe_key), ("run", found.run_id and (
            f"{found.run_id}" + ("" if found.run_partition is None else f" partition {found.run_partition}"))),
            ("continued from", found.continued_from), ("created", found.created_at), ("due", found.run_after),
            ("started", found.started_at), ("finished", found.finished_at)):
        if value is not None:
            print(f"  {label + ':':<15} {value}")
    for label, text in (("progress", found.progress_json), ("payload", found.payload_json),
                        ("result", found.result_json), ("error", found.error_json),
                        ("checkpoint", found.checkpoint_json)):
        if text is not None:
            print(f"  {label + ':':<15} {shorten(text, 500)}")
    print("events:")
    for event in events:
        print(f"  {event.at:%Y-%m-%d %H:%M:%S.%f} {event.from_state or 'enqueued':<9} -> {event.to_state:<9} "
              f"token {event.lease_token} {event.worker or ''} {shorten(event.detail_json or '', 300)}".rstrip()
              + (f" (by {event.by_user})" if event.by_user else ""))
    return 0

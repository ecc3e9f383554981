"""`queueworker status`, and the flow control of a queue: `pause`, `resume`, `limit` and `breaker`
(docs/flow-control.md). The work is done by queueworker.client; here the arguments are read and the
outcome printed."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from ..client import operations, status
from ..db.flow import KeyRow
from ..settings import one_line
from .common import CliError, bounded_int, command, connect
from .tables import render_status


def add_status(sub: Any, common: argparse.ArgumentParser) -> None:
    st = command(sub, "status", parents=[common], help="counts per queue and state, live workers")
    st.add_argument("--queue", default=None, help="only this queue (and the workers that work it)")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.add_argument("--stuck", action="store_true",
                    help="list running tasks whose lease has expired and that nobody has rescued yet")


def cmd_status(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
        report = status.collect(conn, args.queue, stuck=args.stuck)
    print(json.dumps(report, indent=2, default=str) if args.json else render_status(report))
    return 0


def add_pause(sub: Any, common: argparse.ArgumentParser) -> None:
    pause = command(sub, "pause", parents=[common],
                    help="stop claims of a queue, or of one key of it (running tasks finish), until resumed, "
                         "or --for a while")
    pause.add_argument("queue")
    pause.add_argument("--key", metavar="K", help="only this key: claims pass over its tasks to the next key's")
    pause.add_argument("--for", dest="duration", metavar="DURATION", help="e.g. 90s, 10m, 2h, 1d")


def add_resume(sub: Any, common: argparse.ArgumentParser) -> None:
    resume = command(sub, "resume", parents=[common], help="end a queue's (or a key's) pause and wake its workers")
    resume.add_argument("queue")
    resume.add_argument("--key", metavar="K", help="end this key's pause")


def add_limit(sub: Any, common: argparse.ArgumentParser) -> None:
    limit = command(sub, "limit", parents=[common],
                    help="set a queue's limits (rate, running tasks across all workers, and per key), or one "
                         "key's; what is not given is removed")
    limit.add_argument("queue")
    limit.add_argument("--rate", metavar="N/s|N/m", help="tasks started per second (/s) or minute (/m)")
    limit.add_argument("--burst", type=bounded_int(1, 1_000_000), help="tokens the bucket holds (default: 1 s)")
    limit.add_argument("--concurrency", type=bounded_int(1, 1_000_000), metavar="N",
                       help="at most N of the queue's tasks running at once, across all workers")
    limit.add_argument("--per-key-rate", metavar="N/s|N/m",
                       help="default for every key of the queue: tasks of the key started per second or minute "
                            "(the tasks without a key count as one key)")
    limit.add_argument("--per-key-burst", type=bounded_int(1, 1_000_000), metavar="B",
                       help="tokens each key's bucket holds (default: 1 s)")
    limit.add_argument("--per-key-concurrency", type=bounded_int(1, 1_000_000), metavar="N",
                       help="default for every key: at most N of the key's tasks running at once")
    limit.add_argument("--key", metavar="K",
                       help="one key of the queue: --rate, --burst, --concurrency and --weight are its own (or --clear)")
    limit.add_argument("--weight", type=_weight, metavar="W",
                       help="with --key: the key takes W claims per turn in the queue's fair share (default 1)")
    limit.add_argument("--clear", action="store_true",
                       help="remove the queue's limits (with --key: the key's own limits and weight)")


def _weight(text: str) -> float:
    """--weight: a finite number (its bounds are operations.set_limits's, checked there)."""
    try:
        weight = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(weight):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return weight


def add_breaker(sub: Any, common: argparse.ArgumentParser) -> None:
    breaker = command(sub, "breaker", parents=[common],
                      help="a circuit breaker: N consecutive failures stop claims for a cooldown, then "
                           "one probe task decides")
    breaker.add_argument("queue")
    breaker.add_argument("--failures", type=bounded_int(1, 1_000_000), metavar="N")
    breaker.add_argument("--cooldown", metavar="DURATION", help="e.g. 30s, 5m")
    breaker.add_argument("--off", action="store_true", help="remove the breaker")
    breaker.add_argument("--per-key", action="store_true",
                         help="a breaker for each key of the queue: a failing key loses its turn, the others run")


def _given(parse: Callable[[str], float], text: str | None) -> float | None:
    """A flag's value parsed, None when the flag is absent (an empty value is refused by `parse`)."""
    return None if text is None else parse(text)


def cmd_flow(args: argparse.Namespace) -> int:
    """pause, resume, limit and breaker: change a queue's (or one key's) flow control, then print it."""
    with connect(args.dsn) as conn:
        try:
            if args.subcommand in ("pause", "resume", "limit") and args.key is not None:
                row = _key_change(conn, args)
            elif args.subcommand == "pause":
                row = operations.pause(conn, args.queue, seconds=_given(operations.parse_duration, args.duration))
            elif args.subcommand == "resume":
                row = operations.resume(conn, args.queue)
            elif args.subcommand == "limit":
                if args.weight is not None:
                    raise CliError("--weight needs --key")
                given = (args.rate, args.concurrency, args.burst, args.per_key_rate, args.per_key_burst,
                         args.per_key_concurrency)
                if args.clear == any(value is not None for value in given):
                    raise CliError("give --rate, --concurrency and/or --per-key-rate, --per-key-concurrency, "
                                   "or --clear")
                row = operations.set_limits(
                    conn, args.queue, burst=args.burst, max_running=args.concurrency,
                    rate_per_second=_given(operations.parse_rate, args.rate),
                    per_key_rate_per_second=_given(operations.parse_rate, args.per_key_rate),
                    per_key_burst=args.per_key_burst, per_key_max_running=args.per_key_concurrency)
            else:
                if args.off == (args.failures is not None or args.cooldown is not None):
                    raise CliError("give --failures and --cooldown, or --off")
                row = operations.set_breaker(conn, args.queue, failures=args.failures, per_key=args.per_key,
                                             cooldown_seconds=_given(operations.parse_duration, args.cooldown))
        except ValidationError as exc:
            raise CliError(one_line(exc, {"": "queue"})) from None
        except ValueError as exc:
            raise CliError(str(exc)) from None
        conn.commit()
    if args.subcommand in ("pause", "resume", "limit") and args.key is not None:
        # The key was checked (printable text) before anything was written.
        if args.subcommand == "limit" and args.clear:
            print(f"queue {args.queue}: key {args.key} takes 1 claim per turn and the queue's per-key defaults"
                  + ("" if row else " (it had no settings of its own)"))
        else:
            print(f"queue {args.queue}: key {args.key}: "
                  + ("no settings of its own" if row is None else status.describe_key(row)))
    elif row is None:
        print(f"queue {args.queue} has no flow control")
    else:
        print(f"queue {args.queue}: " + status.describe_flow(status.flow_control(row)))
    return 0


def _key_change(conn: Any, args: argparse.Namespace) -> KeyRow | None:
    """`limit Q --key K ...` (a key's own limits and weight, or --clear), `pause Q --key K [--for D]`,
    `resume Q --key K`: the key's settings after the change, None when it has none left."""
    if args.subcommand == "pause":
        return operations.pause(conn, args.queue, key=args.key,
                                seconds=_given(operations.parse_duration, args.duration))
    if args.subcommand == "resume":
        return operations.resume(conn, args.queue, key=args.key)
    if args.per_key_rate is not None or args.per_key_burst is not None or args.per_key_concurrency is not None:
        raise CliError("--per-key-... set the defaults of every key: give them without --key")
    if args.clear == any(value is not None for value in (args.rate, args.burst, args.concurrency, args.weight)):
        raise CliError("give --key with --rate, --concurrency and/or --weight, or with --clear")
    return operations.set_limits(conn, args.queue, key=args.key, weight=args.weight, burst=args.burst,
                                 max_running=args.concurrency, rate_per_second=_given(operations.parse_rate, args.rate))

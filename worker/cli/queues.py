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
                    help="stop claims of a queue (running tasks finish) until resumed, or --for a while")
    pause.add_argument("queue")
    pause.add_argument("--for", dest="duration", metavar="DURATION", help="e.g. 90s, 10m, 2h, 1d")


def add_resume(sub: Any, common: argparse.ArgumentParser) -> None:
    resume = command(sub, "resume", parents=[common], help="end a queue's pause and wake its workers")
    resume.add_argument("queue")


def add_limit(sub: Any, common: argparse.ArgumentParser) -> None:
    limit = command(sub, "limit", parents=[common],
                    help="rate-limit a queue and/or cap its running tasks across all workers")
    limit.add_argument("queue")
    limit.add_argument("--rate", metavar="N/s|N/m", help="tasks started per second (/s) or minute (/m)")
    limit.add_argument("--burst", type=bounded_int(1, 1_000_000), help="tokens the bucket holds (default: 1 s)")
    limit.add_argument("--concurrency", type=bounded_int(1, 1_000_000), metavar="N",
                       help="at most N of the queue's tasks running at once, across all workers")
    limit.add_argument("--key", metavar="K", help="a key of the queue: set its --weight (or --clear it)")
    limit.add_argument("--weight", type=_weight, metavar="W",
                       help="with --key: the key takes W claims per turn in the queue's fair share (default 1)")
    limit.add_argument("--clear", action="store_true",
                       help="remove the queue's rate and concurrency limits (with --key: the key's weight)")


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


def _given(parse: Callable[[str], float], text: str | None) -> float | None:
    """A flag's value parsed, None when the flag is absent (an empty value is refused by `parse`)."""
    return None if text is None else parse(text)


def cmd_flow(args: argparse.Namespace) -> int:
    """pause, resume, limit and breaker: change a queue's flow control, then print it."""
    with connect(args.dsn) as conn:
        try:
            if args.subcommand == "pause":
                row = operations.pause(conn, args.queue, seconds=_given(operations.parse_duration, args.duration))
            elif args.subcommand == "resume":
                row = operations.resume(conn, args.queue)
            elif args.subcommand == "limit" and (args.key is not None or args.weight is not None):
                return _key_weight(conn, args)
            elif args.subcommand == "limit":
                if args.clear == (args.rate is not None or args.concurrency is not None or args.burst is not None):
                    raise CliError("give --rate and/or --concurrency, or --clear")
                row = operations.set_limits(conn, args.queue, burst=args.burst, max_running=args.concurrency,
                                            rate_per_second=_given(operations.parse_rate, args.rate))
            else:
                if args.off == (args.failures is not None or args.cooldown is not None):
                    raise CliError("give --failures and --cooldown, or --off")
                row = operations.set_breaker(conn, args.queue, failures=args.failures,
                                             cooldown_seconds=_given(operations.parse_duration, args.cooldown))
        except ValidationError as exc:
            raise CliError(one_line(exc, {"": "queue"})) from None
        except ValueError as exc:
            raise CliError(str(exc)) from None
        conn.commit()
    if row is None:
        print(f"queue {args.queue} has no flow control")
    else:
        print(f"queue {args.queue}: " + status.describe_flow(status.flow_control(row)))
    return 0


def _key_weight(conn: Any, args: argparse.Namespace) -> int:
    """`limit Q --key K --weight W` or `--key K --clear`: a key's weight in the queue's fair share."""
    if args.key is None:
        raise CliError("--weight needs --key")
    if args.rate is not None or args.concurrency is not None or args.burst is not None:
        raise CliError("--key takes --weight or --clear only: rates and caps are the queue's")
    if args.clear == (args.weight is not None):
        raise CliError("give --key with --weight, or with --clear")
    try:
        row = operations.set_limits(conn, args.queue, key=args.key, weight=args.weight)
    except ValidationError as exc:
        raise CliError(one_line(exc, {"": "queue"})) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    conn.commit()
    if args.clear:
        print(f"queue {args.queue}: key {args.key} takes 1 claim per turn" + ("" if row else " (it had no weight)"))
    else:
        print(f"queue {args.queue}: key {args.key} takes {row.weight:g} claims per turn")
    return 0

"""`queueworker keys Q`: the keys of a queue, the busiest first (queueworker.client.keys does the
reading; here the arguments are read and the report printed)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pydantic import ValidationError

from ..client import keys
from ..settings import one_line
from .common import CliError, bounded_int, command, connect
from .tables import Column, age_text, table, terminal_text


def add_keys(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = command(sub, "keys", parents=[common],
                     help="the keys of a queue: tasks ready, due later, blocked and running per key, the busiest "
                          "first, with their limits")
    parser.add_argument("queue")
    parser.add_argument("--limit", type=bounded_int(1, keys.MAX_KEYS_LISTED), default=keys.DEFAULT_KEYS_LISTED,
                        metavar="N", help=f"list at most N keys (default {keys.DEFAULT_KEYS_LISTED}); "
                                          "the totals count them all")
    parser.add_argument("--json", action="store_true", help="print JSON")


def cmd_keys(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
        try:
            report = keys.key_report(conn, args.queue, args.limit)
        except ValidationError as exc:
            raise CliError(one_line(exc, {"": "queue"})) from None
    print(json.dumps(report, indent=2) if args.json else render_keys(report))
    return 0


def render_keys(report: dict[str, Any]) -> str:
    listed = report["keys"]
    summary = (f"queue {terminal_text(report['queue'])}: {report['keys_total']:,} keys, "
               f"{report['ready_total']:,} tasks ready, {report['running_total']:,} running")
    if len(listed) < report["keys_total"]:
        summary += f" (the {len(listed):,} with the most ready below)"
    if not listed:
        return summary
    # The health columns only for a queue whose keys have some (key-limited: migration 022), so the
    # table keeps within 80 columns: the failure streak, and the age of the last success and failure.
    health = keys.has_health(report)
    rows = [("(no key)" if key["key"] is None else terminal_text(key["key"]), key["ready"], key["later"],
             key["blocked"], key["running"], age_text(key["oldest_ready_seconds"]),
             "" if key["weight"] is None else f"{key['weight']:g}",
             *((key["failure_streak"], f"{age_text(key['last_success_seconds'])}/"
                                       f"{age_text(key['last_failure_seconds'])}") if health else ()),
             keys.describe_limits(key)) for key in listed]
    return "\n".join([summary, *table(
        [Column("KEY", flexible=True), Column("READY", right=True), Column("LATER", right=True),
         Column("BLOCKED", right=True), Column("RUNNING", right=True), Column("OLDEST", right=True),
         Column("WEIGHT", right=True),
         *((Column("FAILS", right=True), Column("LAST OK/FAIL", right=True)) if health else ()),
         Column("LIMITS", flexible=True)], rows)])


"""`queueworker grant`, `revoke` and `grants`: which queues a producer login may use (queue grants,
docs/security.md). The work is done by queueworker.client.grants; here the arguments are read and the
outcome printed."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..client import grants
from .common import CliError, command, connect
from .tables import Column, table


def add_grant(sub: Any, common: argparse.ArgumentParser) -> None:
    grant = command(sub, "grant", parents=[common],
                    help="let a database role (and its members) use the queues matching a pattern; once any "
                         "grant exists, producers may use only the queues their grants match")
    grant.add_argument("role", help="a database role, e.g. billing_app or a group of producer logins")
    grant.add_argument("--queue", required=True, metavar="PATTERN",
                       help="a queue name or a glob: billing.* (any run of characters), job-? (one)")


def add_revoke(sub: Any, common: argparse.ArgumentParser) -> None:
    revoke = command(sub, "revoke", parents=[common], help="remove exactly one queue grant of a role")
    revoke.add_argument("role")
    revoke.add_argument("--queue", required=True, metavar="PATTERN", help="the pattern as it was granted")


def add_grants(sub: Any, common: argparse.ArgumentParser) -> None:
    listing = command(sub, "grants", parents=[common], help="list the queue grants")
    listing.add_argument("--json", action="store_true", help="print JSON")


def cmd_grant(args: argparse.Namespace) -> int:
    """grant and revoke: change one grant, then say what changed."""
    with connect(args.dsn) as conn:
        try:
            if args.subcommand == "grant":
                changed = grants.grant_queue(conn, args.role, args.queue)
            else:
                changed = grants.revoke_queue(conn, args.role, args.queue)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        conn.commit()
    if args.subcommand == "grant":
        print(f"{args.role} may use queues matching {args.queue}" + ("" if changed else " (it already could)"))
    else:
        print(f"revoked {args.role}'s grant of {args.queue}" if changed
              else f"{args.role} has no grant of exactly {args.queue}: nothing revoked")
    return 0


def cmd_grants(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
        rows = grants.queue_grants(conn)
    if args.json:
        print(json.dumps([row._asdict() for row in rows], indent=2, default=str))
    elif not rows:
        print("no queue grants: every producer may use every queue")
    else:
        print("\n".join(table(
            [Column("ROLE"), Column("QUEUES", flexible=True), Column("GRANTED BY"), Column("GRANTED AT")],
            [(row.role + ("" if row.role_exists else " (dropped)"), row.pattern, row.granted_by,
              row.granted_at.isoformat(timespec="seconds")) for row in rows])))
    return 0

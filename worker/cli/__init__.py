"""The `queueworker` command line: migrate, enqueue, worker, status, retry, cancel, demo, ...

Every user error (bad JSON, a bad flag or environment variable, a malformed or unreachable
database URL) ends in one line on stderr, `queueworker: ...`, and a non-zero exit status (2 for
usage errors), never a traceback. Nothing printed or logged carries the database password: the
URL is validated before anything starts, database errors are explained by `dsn.explain`, and
logs and messages are scrubbed of the URL and its password.

The commands only read their arguments and print: what they do is done by queueworker.client (and
queueworker.dev, queueworker.console, queueworker.runtime), which the console and applications
call too. One module per group of commands: `tasks`, `queues`, `keys`, `runs`, `cron`, `grants`, `worker`,
`local`.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from typing import Any

import psycopg
from pydantic import ValidationError

from .. import __version__, dsn as dsns
from ..settings import SettingsError, one_line
from . import cron, grants, keys, local, queues, runs, tasks, worker
from .common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, ArgumentParser, CliError, database_url, secrets

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_USAGE", "build_parser", "main"]

# What a command meets in a database that was never migrated (or migrated by an older version).
SCHEMA_MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedColumn,
                  psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedObject)

AddParser = Callable[[Any, argparse.ArgumentParser], None]
# Every command, in the order --help lists them: its name, what adds its parser (given the
# subcommands and the parser of the options every command shares), and what runs it.
COMMANDS: tuple[tuple[str, AddParser, Callable[[argparse.Namespace], int]], ...] = (
    ("migrate", worker.add_migrate, worker.cmd_migrate),
    ("enqueue", tasks.add_enqueue, tasks.cmd_enqueue),
    ("worker", worker.add_worker, worker.cmd_worker),
    ("status", queues.add_status, queues.cmd_status),
    ("list", tasks.add_list, tasks.cmd_list),
    ("retry", tasks.add_retry, tasks.cmd_retry),
    ("cancel", tasks.add_cancel, tasks.cmd_cancel),
    ("pause", queues.add_pause, queues.cmd_flow),
    ("resume", queues.add_resume, queues.cmd_flow),
    ("limit", queues.add_limit, queues.cmd_flow),
    ("breaker", queues.add_breaker, queues.cmd_flow),
    ("keys", keys.add_keys, keys.cmd_keys),
    ("show", tasks.add_show, tasks.cmd_show),
    ("runs", runs.add_runs, runs.cmd_runs),
    ("run", runs.add_run, runs.cmd_run),
    ("cron", cron.add_cron, cron.cmd_cron),
    ("grant", grants.add_grant, grants.cmd_grant),
    ("revoke", grants.add_revoke, grants.cmd_grant),
    ("grants", grants.add_grants, grants.cmd_grants),
    ("demo", local.add_demo, local.cmd_demo),
    ("console", local.add_console, local.cmd_console),
    ("dev-db", local.add_dev_db, local.cmd_dev_db),
)
_RUN_BY_NAME = {name: run for name, _, run in COMMANDS}
# Commands that need no database URL: the demo starts its own database; dev-db is one.
_OWN_DATABASE = ("demo", "dev-db")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="queueworker", description="Postgres lease queue workers.")
    parser.add_argument("--version", action="version", version=f"queueworker {__version__}")
    common = ArgumentParser(add_help=False)
    common.add_argument("--dsn", default=None, help="Postgres connection URL (default: $DATABASE_URL)")
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    for _, add_parser, _ in COMMANDS:
        add_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `worker --processes` starts its workers with
    url: str | None = None
    try:
        if args.subcommand not in _OWN_DATABASE or getattr(args, "dsn", None) is not None:
            args.dsn = url = database_url(args)
        return _RUN_BY_NAME[args.subcommand](args)
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
        print(dsns.scrub("".join(traceback.format_exception(exc)), secrets(url)), file=sys.stderr, end="")
        return _fail(f"internal error: {type(exc).__name__}", EXIT_FAILURE, url)


def _fail(message: str, code: int, url: str | None) -> int:
    print(f"queueworker: {dsns.scrub(message, secrets(url))}", file=sys.stderr)
    return code

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
import importlib
import sys
import traceback
from collections.abc import Callable
from typing import Any

import psycopg
from pydantic import ValidationError

from .. import __version__, dsn as dsns
from ..settings import SettingsError, one_line
from .common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, ArgumentParser, CliError, database_url, secrets

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_USAGE", "build_parser", "main"]

# What a command meets in a database that was never migrated (or migrated by an older version).
SCHEMA_MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedColumn,
                  psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedObject)

AddParser = Callable[[Any, argparse.ArgumentParser], None]
# Every command, in the order --help lists them: its name, the module of this package that holds it,
# and the names there of what adds its parser (given the subcommands and the parser of the options
# every command shares) and of what runs it. A command's module is imported when its parser is
# built: a process started for one command (a worker, above all) loads no other command's module.
COMMANDS: tuple[tuple[str, str, str, str], ...] = (
    ("migrate", "worker", "add_migrate", "cmd_migrate"),
    ("enqueue", "tasks", "add_enqueue", "cmd_enqueue"),
    ("worker", "worker", "add_worker", "cmd_worker"),
    ("status", "queues", "add_status", "cmd_status"),
    ("list", "tasks", "add_list", "cmd_list"),
    ("retry", "tasks", "add_retry", "cmd_retry"),
    ("cancel", "tasks", "add_cancel", "cmd_cancel"),
    ("pause", "queues", "add_pause", "cmd_flow"),
    ("resume", "queues", "add_resume", "cmd_flow"),
    ("limit", "queues", "add_limit", "cmd_flow"),
    ("breaker", "queues", "add_breaker", "cmd_flow"),
    ("keys", "keys", "add_keys", "cmd_keys"),
    ("show", "tasks", "add_show", "cmd_show"),
    ("runs", "runs", "add_runs", "cmd_runs"),
    ("run", "runs", "add_run", "cmd_run"),
    ("cron", "cron", "add_cron", "cmd_cron"),
    ("grant", "grants", "add_grant", "cmd_grant"),
    ("revoke", "grants", "add_revoke", "cmd_grant"),
    ("grants", "grants", "add_grants", "cmd_grants"),
    ("demo", "local", "add_demo", "cmd_demo"),
    ("console", "local", "add_console", "cmd_console"),
    ("dev-db", "local", "add_dev_db", "cmd_dev_db"),
)
_BY_NAME = {name: (module, add, run) for name, module, add, run in COMMANDS}
# Commands that need no database URL: the demo starts its own database; dev-db is one.
_OWN_DATABASE = ("demo", "dev-db")


def _function(module: str, name: str) -> Callable[..., Any]:
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `command` alone (a command's own arguments parse the same
    either way; `main` builds only the one it was given, when it knows it)."""
    parser = ArgumentParser(prog="queueworker", description="Postgres lease queue workers.")
    parser.add_argument("--version", action="version", version=f"queueworker {__version__}")
    common = ArgumentParser(add_help=False)
    common.add_argument("--dsn", default=None, help="Postgres connection URL (default: $DATABASE_URL)")
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    for name, module, add, _ in COMMANDS:
        if command is None or name == command:
            _function(module, add)(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_given = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(args_given[0] if args_given and args_given[0] in _BY_NAME else None).parse_args(args_given)
    args.argv = args_given  # what `worker --processes` starts its workers with
    url: str | None = None
    try:
        if args.subcommand not in _OWN_DATABASE or getattr(args, "dsn", None) is not None:
            args.dsn = url = database_url(args)
        module, _, run = _BY_NAME[args.subcommand]
        return _function(module, run)(args)
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

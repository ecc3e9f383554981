"""What every command of the `queueworker` CLI shares: its errors and exit statuses, the parser that
reports a usage error as one line, argument types, the database URL and the connection, and the
payload read from a flag, a file or stdin."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import psycopg

from .. import dsn as dsns, jsonvalue

EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
CONNECT_TIMEOUT_SECONDS = 10
MAX_COUNT = 1_000_000
BIGINT_MAX = 2**63 - 1
# TaskSpec fields as `queueworker enqueue` names them in messages.
ENQUEUE_LABELS = {"task": "TASK", "queue": "--queue", "priority": "--priority",
                  "delay": "--delay", "max_attempts": "--max-attempts", "timeout_seconds": "--timeout",
                  "dedupe_key": "--dedupe-key", "dedupe": "--dedupe-spec", "on_conflict": "--on-conflict",
                  "depends_on": "--after", "on_dependency_failure": "--on-dependency-failure", "headers": "--header",
                  "key": "--key"}


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


def command(commands: Any, name: str, **options: Any) -> argparse.ArgumentParser:
    """A subcommand whose --help opens with a description (its one-line help, unless given)."""
    summary = options.get("help") or ""
    options.setdefault("description", summary[:1].upper() + summary[1:] + ("." if summary else ""))
    return commands.add_parser(name, **options)


def bounded_int(low: int, high: int) -> Any:
    """An argument type: a whole number from `low` to `high`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:,} to {high:,}")
        return value

    return parse


def default(model: Any, field: str) -> Any:
    """A pydantic model's default for `field`, shown in --help."""
    return model.model_fields[field].default


def database_url(args: argparse.Namespace) -> str:
    """The database URL from --dsn or $DATABASE_URL, validated before anything uses it."""
    url, source = (args.dsn, "--dsn") if args.dsn else (os.environ.get("DATABASE_URL"), "DATABASE_URL")
    if not url:
        raise CliError("no database: pass --dsn or set DATABASE_URL")
    try:
        dsns.validate(url)
    except dsns.InvalidDsn as exc:
        raise CliError(f"{source}: {exc}") from None
    return url


def secrets(url: str | None) -> list[str]:
    """What must never be printed: the URL itself, its password, and libpq's $PGPASSWORD."""
    if not url:
        return []
    return [url, dsns.parse(url).get("password"), os.environ.get("PGPASSWORD")]  # type: ignore[list-item]


def connect(url: str) -> psycopg.Connection:
    """The command's connection: never preparing statements (the URL may lead to a pooler)."""
    from ..db.connection import NEVER_PREPARE
    return psycopg.connect(url, application_name="queueworker-cli", connect_timeout=CONNECT_TIMEOUT_SECONDS,
                           **NEVER_PREPARE)


def payload(args: argparse.Namespace) -> dict[str, Any]:
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


def shorten(text: str, limit: int = 200) -> str:
    """A value shown on one line of a listing: a watermark written by hand may be of any size."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"

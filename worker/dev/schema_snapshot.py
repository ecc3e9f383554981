"""`python -m queueworker.dev.schema_snapshot [--check] [--dsn URL] [--output PATH]`: migrations/schema.sql.

The migrations say how a schema changed, version by version; `migrations/schema.sql` says what the
schema is, in one file a reviewer can read and diff. It is `pg_dump --schema-only --schema=queueworker
--no-owner` of a database freshly migrated in a scratch database, normalised so that it compares
equal on every machine: pg_dump's comment lines, its SET / set_config / \\restrict header lines
(they carry its version and a random key) go, runs of blank lines become one. A header of our own
names the Postgres major version it was dumped with (pg_dump's output differs between majors) and
the command that regenerates it.

Without `--dsn` a throwaway local server is started (queueworker.dev.localpg); with one, the server it
names must let the role create a database. pg_dump comes from the same bin directory as the local
server's (`find_bin_dir`, or $QUEUEWORKER_PG_BIN). `--check` writes nothing and exits 1 with a
unified diff when the file is stale; tests/test_schema_snapshot.py checks the same in the tests.
It imports only `migrate` and `localpg`.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import psycopg
from psycopg import sql

from .localpg import LocalPostgres, PostgresNotFound, find_bin_dir
from ..db.migrate import migrate

REGENERATE = "python -m queueworker.dev.schema_snapshot"
SCHEMA = "queueworker"
_MAJOR_LINE = re.compile(r"^-- Dumped with Postgres (\d+)\.", re.MULTILINE)
# pg_dump's session settings and, since 17.6 / 16.10 / 15.14, the \restrict and \unrestrict lines
# around the script, whose key is random per dump.
_SETTING_LINE = re.compile(r"^(SET .*;|SELECT pg_catalog\.set_config\(.*\);|\\(un)?restrict .*)$")


def default_path() -> Path:
    """migrations/schema.sql beside the migrations this package applies (in a checkout: the repository's)."""
    return Path(str(resources.files("queueworker.migrations").joinpath("schema.sql")))


def normalise(dump: str) -> str:
    """pg_dump's script without its comment lines, settings and blank-line runs."""
    lines: list[str] = []
    for line in dump.splitlines():
        line = line.rstrip()
        if line.startswith("--") or _SETTING_LINE.match(line):
            continue
        if not line and (not lines or not lines[-1]):
            continue
        lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def header(major: int) -> str:
    return (f"-- The {SCHEMA} schema as the migrations leave it: what a reader should find in a freshly migrated\n"
            f"-- database. Generated, do not edit: `pg_dump --schema-only --schema={SCHEMA} --no-owner`, without\n"
            "-- pg_dump's comments and settings. Checked by tests/test_schema_snapshot.py. Regenerate with:\n"
            f"--     {REGENERATE}\n"
            f"-- Dumped with Postgres {major}.\n\n")


def snapshot_major(text: str) -> int | None:
    """The Postgres major version a snapshot's header names, None when it names none."""
    match = _MAJOR_LINE.search(text)
    return int(match[1]) if match else None


def server_major(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version // 10000


def dump(dsn: str, bin_dir: Path | None = None) -> str:
    """The snapshot of the (migrated) database at `dsn`: header and normalised pg_dump output. The
    password travels in PGPASSWORD, never in pg_dump's argv."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    password = params.pop("password", None)
    env = dict(os.environ)
    if password is not None:
        env["PGPASSWORD"] = str(password)
    pg_dump = (bin_dir or find_bin_dir()) / "pg_dump"
    result = subprocess.run([str(pg_dump), "--schema-only", f"--schema={SCHEMA}", "--no-owner",
                             f"--dbname={psycopg.conninfo.make_conninfo(**params)}"],
                            capture_output=True, text=True, env=env, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"pg_dump failed ({result.returncode}): {result.stderr.strip()}")
    return header(server_major(dsn)) + normalise(result.stdout)


def fresh_snapshot(admin_dsn: str, bin_dir: Path | None = None) -> str:
    """Migrates a scratch database on the server of `admin_dsn`, dumps it and drops it."""
    name = f"queueworker_snapshot_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        scratch = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
        migrate(scratch)
        return dump(scratch, bin_dir)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def stale_diff(current: str, fresh: str, path: Path) -> str:
    """A unified diff from the file as it is to what it should be; empty when it is up to date."""
    return "".join(difflib.unified_diff(current.splitlines(keepends=True), fresh.splitlines(keepends=True),
                                        f"{path} (checked in)", f"{path} (freshly migrated)"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff when the file is stale")
    parser.add_argument("--dsn", help="a server where a scratch database may be created (default: a throwaway one)")
    parser.add_argument("--output", type=Path, default=None, help="default: migrations/schema.sql")
    args = parser.parse_args(argv)
    path = args.output or default_path()
    try:
        if args.dsn:
            fresh = fresh_snapshot(args.dsn)
        else:
            server = LocalPostgres()
            server.start()
            try:
                fresh = fresh_snapshot(server.dsn, server.bin_dir)
            finally:
                server.destroy()
    except (PostgresNotFound, RuntimeError, psycopg.Error) as exc:
        print(f"{REGENERATE}: {exc}", file=sys.stderr)
        return 2
    current = path.read_text() if path.exists() else ""
    if args.check:
        diff = stale_diff(current, fresh, path)
        if diff:
            sys.stdout.write(diff)
            print(f"{path} is stale; regenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    if current != fresh:
        path.write_text(fresh)
        print(f"wrote {path}")
    else:
        print(f"{path} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

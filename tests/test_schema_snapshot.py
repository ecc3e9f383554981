"""migrations/schema.sql is the schema the migrations leave, kept up to date in the same change.

A migration (or a function file) that changes the schema without regenerating the snapshot fails
here, with the diff and the command that regenerates it. pg_dump's output differs between Postgres
major versions, so a server of another major than the snapshot's cannot check it: that skips with
the reason locally, and fails in CI, where the checked major version must be the one tested.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from queueworker.dev import schema_snapshot
from queueworker.dev.localpg import find_bin_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "migrations" / "schema.sql"


def _bin_dir(postgres) -> Path:
    server, _ = postgres
    return server.bin_dir if server is not None else find_bin_dir()


def _same_major_or_skip(dsn: str, snapshot: str) -> None:
    wanted = schema_snapshot.snapshot_major(snapshot)
    assert wanted is not None, f"{SNAPSHOT} names no Postgres major version in its header"
    running = schema_snapshot.server_major(dsn)
    if running != wanted:
        reason = (f"the test server runs Postgres {running}, the snapshot was dumped with Postgres {wanted}: "
                  "pg_dump's output differs between majors")
        pytest.fail(reason) if os.environ.get("CI") else pytest.skip(reason)


def test_the_checked_in_schema_is_the_one_the_migrations_make(dsn, postgres):
    checked_in = SNAPSHOT.read_text()
    _same_major_or_skip(dsn, checked_in)
    fresh = schema_snapshot.dump(dsn, _bin_dir(postgres))
    diff = schema_snapshot.stale_diff(checked_in, fresh, SNAPSHOT.relative_to(ROOT))
    assert not diff, f"migrations/schema.sql is stale; regenerate it with: {schema_snapshot.REGENERATE}\n{diff}"


def test_the_dump_keeps_nothing_that_differs_between_machines(dsn, postgres):
    fresh = schema_snapshot.dump(dsn, _bin_dir(postgres))
    body = fresh.split("\n\n", 1)[1]
    assert not [line for line in body.splitlines() if line.startswith(("--", "SET ", "\\"))]
    assert "set_config('search_path'" not in body and "\n\n\n" not in fresh
    assert "CREATE TABLE queueworker.tasks (" in body and "ALTER TABLE ONLY queueworker.tasks" in body
    assert "OWNER TO" not in body


def test_check_names_a_stale_file_with_its_diff_and_regenerating_makes_it_current(dsn, postgres, tmp_path):
    _, admin_dsn = postgres
    _same_major_or_skip(admin_dsn, SNAPSHOT.read_text())
    stale = tmp_path / "schema.sql"
    stale.write_text(SNAPSHOT.read_text().replace("CREATE TABLE queueworker.workers (",
                                                  "CREATE TABLE queueworker.old_workers ("))
    command = [sys.executable, "-m", "queueworker.dev.schema_snapshot", "--dsn", admin_dsn, "--output", str(stale)]

    checked = subprocess.run([*command, "--check"], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 1, checked
    assert "-CREATE TABLE queueworker.old_workers (\n+CREATE TABLE queueworker.workers (\n" in checked.stdout
    assert schema_snapshot.REGENERATE in checked.stderr

    written = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written
    assert stale.read_text() == schema_snapshot.dump(dsn, _bin_dir(postgres))
    assert subprocess.run([*command, "--check"], capture_output=True, text=True, timeout=120).returncode == 0

"""Databases of earlier schema versions, built as the migrator of their day built them.

Since 2026-11-27 the versioned migrations hold no functions or triggers (migrations/functions/
defines them, re-applied after the versioned ones), so the first N files of `migrations/` no longer
make a working database of version N. tests/fixtures/schema_history/ keeps the migrations as they
stood then, at version 12, with functions and triggers in each; `migrate_to` applies the first N of
them and records them as `queueworker migrate` of that day did: the schema_migrations table of its
own bootstrap (no schema_functions), one transaction per migration, each recorded with the checksum
of its text. Upgrading such a database with today's `migrate` is what a database in the field does.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

from queueworker.db.migrate import Migration

HISTORY = Path(__file__).resolve().parent / "fixtures" / "schema_history"
_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")

# The migrator's bootstrap statement as it stood at version 12: the migrator created only this table.
CREATE_MIGRATIONS_TABLE_AT_12 = """
DO $$
BEGIN
    IF to_regnamespace('queueworker') IS NULL THEN
        CREATE SCHEMA queueworker;
    END IF;
END
$$;
CREATE TABLE IF NOT EXISTS queueworker.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


def history() -> list[Migration]:
    """The migrations of 2026-11-27 (version 12), in version order."""
    found = [Migration(int(match[1]), match[2], path.read_text())
             for path in HISTORY.iterdir() if (match := _FILE_NAME.match(path.name))]
    return sorted(found, key=lambda m: m.version)


def migrate_to(dsn: str, version: int) -> list[Migration]:
    """Brings an empty database to `version` with the historical migrations; returns those applied."""
    applied = history()[:version]
    assert [m.version for m in applied] == list(range(1, version + 1)), f"no history up to version {version}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CREATE_MIGRATIONS_TABLE_AT_12)
        for migration in applied:
            with conn.transaction():
                conn.execute(migration.text)
                conn.execute("INSERT INTO queueworker.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                             (migration.version, migration.name, migration.checksum))
    return applied


def insert_plain_tasks(conn: psycopg.Connection, tasks: list[tuple[str, str, dict]]) -> list[int]:
    """Inserts (queue, task, payload) tasks as the producers of schema versions before 19 did,
    straight into queueworker.tasks (today's producer inserts through queueworker.new_tasks, which
    those versions lack), due now; returns their ids in order."""
    return [conn.execute("INSERT INTO queueworker.tasks (queue, task, payload, delayed) VALUES (%s, %s, %s, false) "
                         "RETURNING id", (queue, task, Jsonb(payload))).fetchone()[0] for queue, task, payload in tasks]

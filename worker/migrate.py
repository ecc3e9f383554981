"""Applies the SQL files in `migrations/` in order, once each, under an advisory lock.

Two migrators started at once are safe: the second waits for the lock, then finds
nothing left to apply.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from . import sql

log = logging.getLogger("queueworker.migrate")

_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def available_migrations() -> list[Migration]:
    """The migrations shipped with this package, in version order."""
    found = []
    for entry in resources.files("queueworker.migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions: {versions}")
    return found


def latest_version() -> int:
    return available_migrations()[-1].version


def migrate(dsn: str) -> list[Migration]:
    """Applies pending migrations; returns the ones applied by this call."""
    applied_now = []
    with psycopg.connect(dsn, autocommit=True, application_name="queueworker-migrate") as conn:
        conn.execute(sql.LOCK_MIGRATIONS, {"key": sql.MIGRATION_LOCK_KEY})
        try:
            conn.execute(sql.CREATE_MIGRATIONS_TABLE)
            done = {row[0]: row for row in conn.execute(sql.APPLIED_MIGRATIONS)}
            for migration in available_migrations():
                if migration.version in done:
                    if done[migration.version][2] != migration.checksum:
                        log.warning("migration %03d_%s changed after it was applied; not re-applied",
                                    migration.version, migration.name)
                    continue
                with conn.transaction():
                    conn.execute(migration.text)
                    conn.execute(sql.RECORD_MIGRATION, {"version": migration.version, "name": migration.name,
                                                        "checksum": migration.checksum})
                log.info("applied migration %03d_%s", migration.version, migration.name)
                applied_now.append(migration)
        finally:
            conn.execute(sql.UNLOCK_MIGRATIONS, {"key": sql.MIGRATION_LOCK_KEY})
    return applied_now


def schema_version(conn: psycopg.Connection) -> int:
    """The highest applied migration, 0 when the schema was never migrated."""
    if not conn.execute(sql.SCHEMA_EXISTS).fetchone()[0]:
        return 0
    return conn.execute(sql.SCHEMA_VERSION).fetchone()[0]

"""What `queueworker migrate` runs besides the migrations themselves (queueworker.db.migrate). The statements are in migration.sql."""

from __future__ import annotations

from typing import NamedTuple

from .statements import NoParams, Params, SqlFile

_SQL = SqlFile("migration")


class TryLockMigrationsParams(Params):
    key: int


class MigrationLockRow(NamedTuple):
    locked: bool
    idle_timeout: str


class SetLockTimeoutParams(Params):
    lock_timeout: str


class LockHoldersParams(Params):
    limit: int


class LockHolderRow(NamedTuple):
    pid: int
    user_name: str
    application_name: str
    state: str
    transaction_seconds: float
    locks: str


class AppliedMigrationRow(NamedTuple):
    version: int
    name: str
    checksum: str


class RecordMigrationParams(Params):
    version: int
    name: str
    checksum: str


class SchemaVersionRow(NamedTuple):
    version: int


class SchemaExistsRow(NamedTuple):
    exists: bool


CREATE_MIGRATIONS_TABLE = _SQL.statement("create_migrations_table", NoParams)
TRY_LOCK_MIGRATIONS = _SQL.statement("try_lock_migrations", TryLockMigrationsParams, MigrationLockRow)
SET_LOCK_TIMEOUT = _SQL.statement("set_lock_timeout", SetLockTimeoutParams)
LOCK_HOLDERS = _SQL.statement("lock_holders", LockHoldersParams, LockHolderRow)
APPLIED_MIGRATIONS = _SQL.statement("applied_migrations", NoParams, AppliedMigrationRow)
RECORD_MIGRATION = _SQL.statement("record_migration", RecordMigrationParams)
SCHEMA_VERSION = _SQL.statement("schema_version", NoParams, SchemaVersionRow)
SCHEMA_EXISTS = _SQL.statement("schema_exists", NoParams, SchemaExistsRow)

_SQL.check_all_declared()

"""What `queueworker migrate` runs around the migrations themselves (queueworker.db.migrate). The
statements are in migration.sql."""

from __future__ import annotations

from typing import NamedTuple

from .statements import NoParams, Params, SqlFile

_SQL = SqlFile("migration")

class SetLockTimeoutParams(Params):
    lock_timeout: str


class LockHoldersParams(Params):
    limit: int


class LockHolderRow(NamedTuple):
    """A session holding locks on queueworker's tables. What the migrator may not see of other
    users' sessions (state, transaction age) is None."""

    pid: int
    user_name: str | None
    application_name: str | None
    state: str | None
    transaction_seconds: float | None
    locks: str

    def __str__(self) -> str:
        about = [f"user {self.user_name}"] if self.user_name else []
        if self.application_name:
            about.append(f"application {self.application_name!r}")
        if self.state:
            about.append(self.state)
        if self.transaction_seconds is not None:
            about.append(f"transaction open {self.transaction_seconds:.0f} s")
        return f"pid {self.pid} ({', '.join(about)}) holding {self.locks}"


class AppliedMigrationRow(NamedTuple):
    version: int
    name: str
    checksum: str


class RecordMigrationParams(Params):
    version: int
    name: str
    checksum: str


class UpdateMigrationChecksumParams(Params):
    checksum: str
    version: int
    superseded: str


class AppliedFunctionRow(NamedTuple):
    name: str
    checksum: str


class RecordFunctionsParams(Params):
    names: list[str]
    checksums: list[str]


class SchemaVersionRow(NamedTuple):
    version: int


class SchemaExistsRow(NamedTuple):
    exists: bool


CREATE_MIGRATIONS_TABLE = _SQL.statement("create_migrations_table", NoParams)
LOCK_MIGRATIONS = _SQL.statement("lock_migrations", NoParams)
SET_LOCK_TIMEOUT = _SQL.statement("set_lock_timeout", SetLockTimeoutParams)
LOCK_HOLDERS = _SQL.statement("lock_holders", LockHoldersParams, LockHolderRow)
APPLIED_MIGRATIONS = _SQL.statement("applied_migrations", NoParams, AppliedMigrationRow)
RECORD_MIGRATION = _SQL.statement("record_migration", RecordMigrationParams)
UPDATE_MIGRATION_CHECKSUM = _SQL.statement("update_migration_checksum", UpdateMigrationChecksumParams)
APPLIED_FUNCTIONS = _SQL.statement("applied_functions", NoParams, AppliedFunctionRow)
FORGET_FUNCTIONS = _SQL.statement("forget_functions", NoParams)
RECORD_FUNCTIONS = _SQL.statement("record_functions", RecordFunctionsParams)
SCHEMA_VERSION = _SQL.statement("schema_version", NoParams, SchemaVersionRow)
SCHEMA_EXISTS = _SQL.statement("schema_exists", NoParams, SchemaExistsRow)

_SQL.check_all_declared()

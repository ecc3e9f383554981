"""Applies the SQL files in `migrations/` in order, once each, then `migrations/functions/`, under one lock.

Two kinds of files. The versioned migrations, `migrations/NNN_name.sql`, change tables, types,
columns, constraints, indexes and data, each applied once, in version order, in a transaction of
its own, and recorded in `queueworker.schema_migrations` with the sha256 of its text. They define
no function and no trigger and call no queueworker function. The function files,
`migrations/functions/NN_concern.sql`, hold every function and trigger, each defined once in its
current form: `CREATE OR REPLACE FUNCTION`, `DROP TRIGGER IF EXISTS` then `CREATE TRIGGER`, and the
REVOKEs. They are applied together, in one transaction, after the versioned migrations, whenever a
versioned migration was applied (each one's transaction forgets the recorded function files, so a
run stopped in between still re-applies them next time) or a file's checksum differs from the one
recorded in `queueworker.schema_functions`. With nothing changed, a run applies no DDL at all.
Order rule: the files run in name order (the numeric prefix), and a file may use only what the
versioned migrations and earlier files (or earlier statements of the same file) define, because
SQL-language bodies are checked when they are created (`check_function_bodies`) and a trigger
needs its function; PL/pgSQL bodies are resolved when they run, so they may call functions of
later files. A database of a newer schema version than this package knows keeps its functions:
an older migrator (a worker of the previous release started with --migrate during a rolling
upgrade, say) must not put older definitions back.

Databases migrated before the functions moved out of the versioned migrations (by 0.1.0, or by an
unreleased version until 2026-11-27) recorded the checksums of those texts as they were then;
`SUPERSEDED_CHECKSUMS` keeps them, so such a record is quietly brought up to date rather than
reported as a changed migration.

Two migrators started at once are safe: the second waits for the lock, then finds
nothing left to apply. The lock is a table lock on `queueworker.schema_migrations` (SHARE UPDATE
EXCLUSIVE, which only a role that may change that table can take: an advisory key could be held
by any login, and no migration could run), so the bookkeeping tables are created before it. It is
transaction-scoped, held for the whole run by a transaction of
its own on a second connection while the migrations commit one by one on the first: a PgBouncer
in transaction pooling mode keeps a transaction on one server connection, but a session-level
lock would stay behind on a server connection other clients share. A running migrator thus uses
two server connections; one waiting for it, none.

A migration never waits long for a table lock. A statement waiting for an ACCESS EXCLUSIVE lock (an
ALTER TABLE behind a long application transaction, say) blocks every later statement on that table,
so a migration queued behind one slow transaction would stall the whole queue. Each migration (and
the transaction of the function files) therefore runs with `SET LOCAL lock_timeout`; when it times
out it rolls back, waits (backoff with jitter, so the application's queued statements get through)
and tries again, up to a total budget, then fails naming the sessions that held the locks.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from importlib import resources

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from . import migration as stmt
from ..backoff import backoff
from .connection import NEVER_PREPARE
from .migration import LockHolderRow
from .statements import NO_PARAMS, Statement, execute, fetch

log = logging.getLogger("queueworker.migrate")

_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
_FUNCTION_FILE_NAME = re.compile(r"^(\d{2}_[a-z0-9_]+)\.sql$")
FUNCTIONS_DIR = "functions"
# Between two attempts a migrator waits at least half as long as its last attempt may have
# blocked others, doubling per attempt up to this cap.
MAX_RETRY_WAIT_SECONDS = 30.0
# How often a migrator waiting for another one tries the migration lock again.
LOCK_POLL_SECONDS = 0.5
# How many lock-holding sessions a failure message names.
HOLDERS_NAMED = 3

# The sha256 of migrations 001-012 as they stood until 2026-11-27 (0.1.0 shipped 001-010), before
# their functions and triggers moved to migrations/functions/. Databases migrated then recorded
# these; the texts are kept in tests/fixtures/schema_history/.
SUPERSEDED_CHECKSUMS: Mapping[int, str] = {
    1: "ea7898cf4d893c5baa9d9d132d129c4ced94d0551df775f4b1b4c572cad76c61",
    2: "02ab4ea202a23ec737dc4df744a78e363a5d16594142d2c910bf3b05f4306a8e",
    3: "1b0ff1f59f86b8e7e5bd187afd3306f155895bf83db9e071b4cd9cd17503f3a0",
    4: "778624a9f6ab65da345ca76c1cabebb5555dd3b60cb4c6c2574d31734fd5f186",
    5: "bd48624d5731c266be1e504f1c33c394431044716aa9f12ab711977d8c43f5ef",
    6: "5f616916a327d99b43488a8b1bef03492a2452218865dcc8c6ddbbd160f366bf",
    7: "9ddf1bdd6d614d6372c8e473a07db568cfb200affaf29716f5f1c96bc45caba8",
    8: "542df7808af113ef0ab7a421d52bd708a967556e2f1157aaf415e78c076e30e4",
    9: "e6b88ca24c7f149ff2a9057c6153ae02c64f7f7c4658e3c09de7228841b1d799",
    10: "4f5ddbbca84093ca90044b5893840ec9e38a688ff67c561850c4a86f042b9b0c",
    11: "1f3a5e903a89d72104971bf66f34f27c1bdf98b42db3433726592d7cabe1c00c",
    12: "1f791228eae5171746d86bcbdef964de4d858b8edddef25240ee939a58da058c",
}


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:03d}_{self.name}"


@dataclass(frozen=True)
class FunctionFile:
    """A file of migrations/functions/, named without `.sql` (`10_audit`)."""

    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


class LockPolicy(BaseModel):
    """How long a migration may wait for its locks: per attempt (`lock_timeout`) and in total.
    Read from the environment by `queueworker migrate` and `queueworker worker --migrate`."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    # At most MAX_RETRY_WAIT_SECONDS, so the waits between attempts stay at least half an attempt long.
    lock_timeout_seconds: float = Field(default=3.0, gt=0, le=MAX_RETRY_WAIT_SECONDS,
                                        alias="QUEUEWORKER_MIGRATE_LOCK_TIMEOUT")
    budget_seconds: float = Field(default=120.0, gt=0, alias="QUEUEWORKER_MIGRATE_LOCK_BUDGET")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> LockPolicy:
        """Raises pydantic.ValidationError naming the variable when a value is not a number in range."""
        names = {field.alias for field in cls.model_fields.values()}
        return cls.model_validate({name: value for name, value in environ.items() if name in names})

    def retry_wait(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        return backoff(attempt - 1, self.lock_timeout_seconds, MAX_RETRY_WAIT_SECONDS, (0.5, 1.0))


class MigrationBlocked(psycopg.errors.LockNotAvailable):
    """A migration could not get its locks within the budget and was rolled back (those before it stay).
    A psycopg error (SQLSTATE 55P03), so every caller that reports database errors reports it."""


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


def available_functions() -> list[FunctionFile]:
    """The function files shipped with this package, in the order they are applied (name order)."""
    found = [FunctionFile(match[1], entry.read_text())
             for entry in resources.files("queueworker.migrations").joinpath(FUNCTIONS_DIR).iterdir()
             if (match := _FUNCTION_FILE_NAME.match(entry.name))]
    return sorted(found, key=lambda f: f.name)


def latest_version() -> int:
    return available_migrations()[-1].version


def migrate(dsn: str, policy: LockPolicy | None = None) -> list[Migration]:
    """Applies pending migrations, then the function files when needed (see the module's doc);
    returns the versioned migrations applied by this call. Raises MigrationBlocked when a step
    cannot get its locks within the policy's budget (default: from the environment)."""
    policy = policy or LockPolicy.from_environment()
    applied_now = []
    with psycopg.connect(dsn, autocommit=True, application_name="queueworker-migrate", **NEVER_PREPARE) as conn:
        _with_lock_retries(conn, policy, "creating the migrations table", partial(_create_migrations_table, conn))
        with _migration_lock(dsn):
            done = {row.version: row for row in fetch(conn, stmt.APPLIED_MIGRATIONS, NO_PARAMS)}
            available = available_migrations()
            for migration in available:
                if migration.version in done:
                    recorded = done[migration.version].checksum
                    if recorded == migration.checksum:
                        continue
                    if recorded == SUPERSEDED_CHECKSUMS.get(migration.version):
                        _with_lock_retries(conn, policy, f"recording the checksum of migration {migration.label}",
                                           partial(_update_checksum, conn, migration, recorded))
                        log.info("migration %s was rewritten when functions moved to migrations/functions/; "
                                 "its recorded checksum is brought up to date", migration.label)
                    else:
                        log.warning("migration %s changed after it was applied; not re-applied", migration.label)
                    continue
                _with_lock_retries(conn, policy, f"migration {migration.label}", partial(_apply, conn, migration))
                log.info("applied migration %s", migration.label)
                applied_now.append(migration)
            newest = max(done, default=0)
            if newest > available[-1].version:
                log.info("the schema is at version %d, newer than this release's %d: its functions are left as "
                         "that release defined them", newest, available[-1].version)
            else:
                _apply_functions_if_needed(conn, policy, force=bool(applied_now))
    return applied_now


def _apply_functions_if_needed(conn: psycopg.Connection, policy: LockPolicy, force: bool) -> None:
    """Applies every function file, in one transaction, when `force` or when one differs from
    (or is missing in) its record; does nothing (no DDL) otherwise."""
    files = available_functions()
    recorded = {row.name: row.checksum for row in fetch(conn, stmt.APPLIED_FUNCTIONS, NO_PARAMS)}
    changed = [f.name for f in files if recorded.get(f.name) != f.checksum]
    if not force and not changed:
        return
    _with_lock_retries(conn, policy, "migrations/functions/", partial(_apply_functions, conn, files))
    log.info("applied the function files (%s)%s", ", ".join(f.name for f in files),
             "" if force else f": changed or new since last applied: {', '.join(changed)}")


@contextlib.contextmanager
def _migration_lock(dsn: str) -> Iterator[None]:
    """Holds the migration lock (on queueworker.schema_migrations), in a transaction on a connection
    of its own, for the `with` block. Waits for it by trying again every LOCK_POLL_SECONDS, outside
    any transaction: a migrator waiting behind another holds no connection a transaction pooler
    could give the other one."""
    with psycopg.connect(dsn, autocommit=True, application_name="queueworker-migrate-lock", **NEVER_PREPARE) as holder:
        while True:
            with holder.transaction():
                if _took(holder, stmt.LOCK_MIGRATIONS):
                    yield
                    return
            time.sleep(LOCK_POLL_SECONDS)


def _took(conn: psycopg.Connection, lock: Statement) -> bool:
    """Runs a NOWAIT lock statement in a savepoint; False when the lock is held elsewhere."""
    try:
        with conn.transaction():
            execute(conn, lock, NO_PARAMS)
        return True
    except psycopg.errors.LockNotAvailable:
        return False


def _create_migrations_table(conn: psycopg.Connection) -> None:
    """Creates the schema and the bookkeeping tables when missing, before the migration lock (which
    is a lock on one of them). Two first runs at once may both try to create them: the one that
    loses learns it from a unique index of the catalog, and finds them there on its next try."""
    while True:
        try:
            with conn.transaction():
                execute(conn, stmt.CREATE_MIGRATIONS_TABLE, NO_PARAMS)
            return
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema, psycopg.errors.DuplicateTable):
            continue


def _apply(conn: psycopg.Connection, migration: Migration) -> None:
    conn.execute(migration.text)
    execute(conn, stmt.RECORD_MIGRATION, stmt.RecordMigrationParams(
        version=migration.version, name=migration.name, checksum=migration.checksum))
    execute(conn, stmt.FORGET_FUNCTIONS, NO_PARAMS)


def _update_checksum(conn: psycopg.Connection, migration: Migration, superseded: str) -> None:
    execute(conn, stmt.UPDATE_MIGRATION_CHECKSUM, stmt.UpdateMigrationChecksumParams(
        version=migration.version, checksum=migration.checksum, superseded=superseded))


def _apply_functions(conn: psycopg.Connection, files: list[FunctionFile]) -> None:
    for function_file in files:
        conn.execute(function_file.text)
    execute(conn, stmt.RECORD_FUNCTIONS, stmt.RecordFunctionsParams(
        names=[f.name for f in files], checksums=[f.checksum for f in files]))


def _with_lock_retries(conn: psycopg.Connection, policy: LockPolicy, what: str, step: Callable[[], object]) -> None:
    """Runs `step` in one transaction under the policy's lock_timeout, retrying it after lock
    timeouts until the budget is spent. The run's migration lock is kept throughout."""
    started = time.monotonic()
    for attempt in itertools.count(1):
        try:
            with conn.transaction():
                execute(conn, stmt.SET_LOCK_TIMEOUT, stmt.SetLockTimeoutParams(
                    lock_timeout=f"{policy.lock_timeout_seconds * 1000:.0f}ms"))
                step()
            return
        except psycopg.errors.LockNotAvailable:
            holders = _lock_holders(conn)
            wait = policy.retry_wait(attempt)
            elapsed = time.monotonic() - started
            if elapsed + wait + policy.lock_timeout_seconds > policy.budget_seconds:
                raise MigrationBlocked(
                    f"{what} could not get its locks within {policy.budget_seconds:g} s ({attempt} attempts of "
                    f"lock_timeout {policy.lock_timeout_seconds:g} s) and was rolled back: {_blocking(holders)}; "
                    "end that transaction (or raise QUEUEWORKER_MIGRATE_LOCK_BUDGET) and run migrate again") from None
            log.warning("%s waited %g s for a lock and was rolled back, retrying in %.1f s: %s", what,
                        policy.lock_timeout_seconds, wait, _blocking(holders))
            time.sleep(wait)


def _lock_holders(conn: psycopg.Connection) -> list[LockHolderRow]:
    """Other sessions holding locks on queueworker's tables, oldest transaction first."""
    return fetch(conn, stmt.LOCK_HOLDERS, stmt.LockHoldersParams(limit=HOLDERS_NAMED))


def _blocking(holders: list[LockHolderRow]) -> str:
    if not holders:
        return "the sessions that held the locks have finished since"
    return "held up by " + "; ".join(map(str, holders))

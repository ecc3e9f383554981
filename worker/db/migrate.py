"""Applies the SQL files in `migrations/` in order, once each, under an advisory lock.

Two migrators started at once are safe: the second waits for the lock, then finds
nothing left to apply. The lock is transaction-scoped, held for the whole run by a transaction of
its own on a second connection while the migrations commit one by one on the first: a PgBouncer
in transaction pooling mode keeps a transaction on one server connection, but a session-level
lock would stay behind on a server connection other clients share. A running migrator thus uses
two server connections; one waiting for it, none.

A migration never waits long for a table lock. A statement waiting for an ACCESS EXCLUSIVE lock
(an ALTER TABLE behind a long application transaction, say) blocks every later statement on that
table, so a migration queued behind one slow transaction would stall the whole queue. Each
migration therefore runs with `SET LOCAL lock_timeout`; when it times out it rolls back, waits
(backoff with jitter, so the application's queued statements get through) and tries again, up to
a total budget, then fails naming the sessions that held the locks.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from importlib import resources

import psycopg
from psycopg.rows import class_row
from pydantic import BaseModel, ConfigDict, Field

from . import sql
from .connection import NEVER_PREPARE

log = logging.getLogger("queueworker.migrate")

_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
# Between two attempts a migrator waits at least half as long as its last attempt may have
# blocked others, doubling per attempt up to this cap.
MAX_RETRY_WAIT_SECONDS = 30.0
# How often a migrator waiting for another one tries the migration lock again.
LOCK_POLL_SECONDS = 0.5
# How many lock-holding sessions a failure message names.
HOLDERS_NAMED = 3


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
        return min(MAX_RETRY_WAIT_SECONDS, self.lock_timeout_seconds * 2.0 ** min(attempt - 1, 16)) \
            * random.uniform(0.5, 1.0)


@dataclass(frozen=True)
class LockHolder:
    """A session holding locks on queueworker's tables (a row of sql.LOCK_HOLDERS). Fields the
    migrator may not see for other users' sessions (state, transaction age) are None."""

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


def latest_version() -> int:
    return available_migrations()[-1].version


def migrate(dsn: str, policy: LockPolicy | None = None) -> list[Migration]:
    """Applies pending migrations; returns the ones applied by this call. Raises MigrationBlocked
    when one cannot get its locks within the policy's budget (default: from the environment)."""
    policy = policy or LockPolicy.from_environment()
    applied_now = []
    with _migration_lock(dsn):
        with psycopg.connect(dsn, autocommit=True, application_name="queueworker-migrate", **NEVER_PREPARE) as conn:
            _with_lock_retries(conn, policy, "creating the migrations table",
                               lambda: conn.execute(sql.CREATE_MIGRATIONS_TABLE))
            done = {row[0]: row for row in conn.execute(sql.APPLIED_MIGRATIONS)}
            for migration in available_migrations():
                if migration.version in done:
                    if done[migration.version][2] != migration.checksum:
                        log.warning("migration %s changed after it was applied; not re-applied", migration.label)
                    continue
                _with_lock_retries(conn, policy, f"migration {migration.label}", partial(_apply, conn, migration))
                log.info("applied migration %s", migration.label)
                applied_now.append(migration)
    return applied_now


@contextlib.contextmanager
def _migration_lock(dsn: str) -> Iterator[None]:
    """Holds the migration lock, in a transaction on a connection of its own, for the `with` block.
    Waits for it by trying again every LOCK_POLL_SECONDS, outside any transaction: a migrator
    waiting behind another holds no connection a transaction pooler could give the other one."""
    with psycopg.connect(dsn, autocommit=True, application_name="queueworker-migrate-lock", **NEVER_PREPARE) as holder:
        while True:
            with holder.transaction():
                (locked, _), = holder.execute(sql.TRY_LOCK_MIGRATIONS, {"key": sql.MIGRATION_LOCK_KEY}).fetchall()
                if locked:
                    yield
                    return
            time.sleep(LOCK_POLL_SECONDS)


def _apply(conn: psycopg.Connection, migration: Migration) -> None:
    conn.execute(migration.text)
    conn.execute(sql.RECORD_MIGRATION, {"version": migration.version, "name": migration.name,
                                        "checksum": migration.checksum})


def _with_lock_retries(conn: psycopg.Connection, policy: LockPolicy, what: str, step: Callable[[], object]) -> None:
    """Runs `step` in one transaction under the policy's lock_timeout, retrying it after lock
    timeouts until the budget is spent. The run's advisory lock is kept throughout."""
    started = time.monotonic()
    for attempt in itertools.count(1):
        try:
            with conn.transaction():
                conn.execute(sql.SET_LOCK_TIMEOUT, {"lock_timeout": f"{policy.lock_timeout_seconds * 1000:.0f}ms"})
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


def _lock_holders(conn: psycopg.Connection) -> list[LockHolder]:
    """Other sessions holding locks on queueworker's tables, oldest transaction first."""
    with conn.cursor(row_factory=class_row(LockHolder)) as cursor:
        return cursor.execute(sql.LOCK_HOLDERS, {"limit": HOLDERS_NAMED}).fetchall()


def _blocking(holders: list[LockHolder]) -> str:
    if not holders:
        return "the sessions that held the locks have finished since"
    return "held up by " + "; ".join(map(str, holders))


def schema_version(conn: psycopg.Connection) -> int:
    """The highest applied migration, 0 when the schema was never migrated."""
    if not conn.execute(sql.SCHEMA_EXISTS).fetchone()[0]:
        return 0
    return conn.execute(sql.SCHEMA_VERSION).fetchone()[0]

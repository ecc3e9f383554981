"""One database that many logins use: a login without a single grant can take any advisory lock,
so queueworker decides nothing by one. Here such a login holds every advisory key it can learn
(those queueworker's releases until version 12 used, and any it sees in pg_locks) while real
worker processes complete tasks, settle dependencies, promote due tasks, rescue an expired lease,
the cleaner's statement deletes history and a migrate run applies the function files again."""

from __future__ import annotations

import re
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from queueworker import enqueue, enqueue_chain
from queueworker.db import duties, statements
from queueworker.db.migrate import migrate
from tests.support import WorkerProcess, query, scalar, wait_until
from tests.test_dependencies import claim, states

ROOT = Path(__file__).resolve().parent.parent

# The keys of the duties, the migrator and the dependency settlement until schema version 12.
KEYS_UNTIL_VERSION_12 = [0x71770001, 0x71770002, 0x71770003, 0x71770004, 1903688709]


class Squatter:
    """A login with no grants that holds advisory keys: the known ones at once, and every key
    another session shows in pg_locks as soon as it is free, until stopped."""

    def __init__(self, dsn: str):
        self._conn = psycopg.connect(dsn, autocommit=True)
        self.held: set[int] = set()
        for key in KEYS_UNTIL_VERSION_12:
            self._take(key)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._harvest, daemon=True)
        self._thread.start()

    def _take(self, key: int) -> None:
        if key not in self.held and self._conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
            self.held.add(key)

    def _harvest(self) -> None:
        while not self._stop.wait(0.02):
            for (key,) in self._conn.execute("""
                    SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
                    WHERE locktype = 'advisory' AND objsubid = 1 AND pid <> pg_backend_pid()""").fetchall():
                self._take(key)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


def test_no_statement_or_function_takes_an_advisory_lock():
    """What any login can take must decide nothing: no SQL of the worker or of the schema's functions
    takes an advisory lock (the versioned migrations of earlier versions did, and are history)."""
    sources = [*ROOT.glob("worker/db/*.sql"), *ROOT.glob("migrations/functions/*.sql")]
    assert len(sources) > 10
    takers = [path.name for path in sources if re.search(r"advisory_(xact_)?lock", path.read_text())]
    assert takers == []


@pytest.fixture
def outsider(dsn):
    """The URL of a login with no grants at all (CONNECT is PUBLIC's)."""
    name = f"qw_outsider_{uuid.uuid4().hex[:8]}"  # roles are the cluster's, shared by every test database
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'outsider'")
    yield make_conninfo(dsn, user=name, password="outsider")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")


@pytest.mark.integration
def test_a_login_without_grants_holding_every_advisory_key_stalls_nothing(dsn, outsider):
    assert conninfo_to_dict(outsider)["user"].startswith("qw_outsider_")
    squatter = Squatter(outsider)
    workers = []
    try:
        assert squatter.held == set(KEYS_UNTIL_VERSION_12)
        with psycopg.connect(dsn, autocommit=True) as conn:
            # A task whose lease a vanished worker holds, for the rescuer.
            orphan = enqueue(conn, "qw.noop", queue="orphans")
            assert list(claim(conn, "orphans")) == [orphan]
            conn.execute("UPDATE queueworker.tasks SET queue = 'default', leased_until = now() WHERE id = %s",
                         (orphan,))
            chain = enqueue_chain(conn, [{"task": "qw.sleep", "payload": {"seconds": 0.05}}] * 5)
            fan_in = enqueue(conn, "qw.noop", depends_on=chain[:3])
            later = enqueue(conn, "qw.noop", delay=1)
        workers = [WorkerProcess(dsn, "--concurrency", "4", "--lease-seconds", "2") for _ in range(2)]
        tasks = [orphan, *chain, fan_in, later]
        wait_until(lambda: states(dsn, tasks) == ["succeeded"] * len(tasks), timeout=60,
                   message="every task, the orphan, the chain and the delayed one to succeed")
        assert scalar(dsn, "SELECT rescues FROM queueworker.tasks WHERE id = %s", (orphan,)) == 1

        with psycopg.connect(dsn, autocommit=True) as conn:
            cleaned = statements.fetch(conn, duties.CLEAN_FINISHED, duties.RetentionParams(
                retention_seconds=0, limit=100))
        assert {row.id for row in cleaned} >= set(tasks)

        # A migrate run takes its lock and applies the function files again (one was "changed").
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE queueworker.schema_functions SET checksum = 'an earlier text' WHERE name = '10_audit'")
        migrated = threading.Thread(target=migrate, args=(dsn,), daemon=True)
        migrated.start()
        wait_until(lambda: not migrated.is_alive(), timeout=60, message="the migrate run to finish")
        assert scalar(dsn, "SELECT count(*) FROM queueworker.schema_functions WHERE checksum = 'an earlier text'") == 0
        assert squatter.held >= set(KEYS_UNTIL_VERSION_12), "the keys were held throughout"
    finally:
        for worker in workers:
            worker.stop()
        squatter.close()


@pytest.mark.integration
def test_no_role_but_the_workers_may_lock_a_duty(dsn, outsider):
    """The duty rows are locked FOR NO KEY UPDATE, which needs UPDATE on the table; the migration
    lock needs a right to change schema_migrations. Even a login that may read every table (as the
    operator role may) can take neither."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        user = conninfo_to_dict(outsider)["user"]
        conn.execute(f"GRANT USAGE ON SCHEMA queueworker TO {user}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA queueworker TO {user}")
    with psycopg.connect(outsider, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM queueworker.duty_locks").fetchone()[0] == 7
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT FROM queueworker.duty_locks FOR KEY SHARE")
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
            conn.execute("LOCK TABLE queueworker.schema_migrations IN SHARE UPDATE EXCLUSIVE MODE NOWAIT")

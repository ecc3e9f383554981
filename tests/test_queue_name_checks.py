"""Migration 014: queue names follow the API's pattern in every column that holds one. A database
of version 12 holding names the pattern refuses is not upgraded: the migration names the offending
rows and changes nothing, and goes through once they are fixed."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from queueworker import names
from queueworker.migrate import migrate
from tests.schema_history import migrate_to
from tests.support import query, scalar

pytestmark = pytest.mark.integration

MIGRATION = Path(__file__).resolve().parents[1] / "migrations" / "014_queue_name_checks.sql"
BAD = "evil/../q2"


def test_the_migration_checks_the_apis_pattern():
    one = names.QUEUE_PATTERN[1:-1]
    patterns = set(re.findall(r"'(\^\[A-Za-z0-9\][^']*\$)'", MIGRATION.read_text()))
    assert patterns == {names.QUEUE_PATTERN, f"^{one}( {one})*$"}, "a name, and names joined by spaces"


def test_rows_breaking_the_pattern_stop_the_upgrade_by_name_and_lose_nothing(blank_dsn):
    migrate_to(blank_dsn, 12)
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queueworker.queues (name, paused_until) VALUES (%s, 'infinity'), ('q2', 'infinity')",
                     (BAD,))
        conn.execute("INSERT INTO queueworker.cron_jobs (name, expression, task, queue, source, next_slot) "
                     "VALUES ('nightly', '0 3 * * *', 't', 'two words', 'runtime', now())")
        conn.execute("INSERT INTO queueworker.workers (id, hostname, pid, queues, concurrency, version) "
                     "VALUES (gen_random_uuid(), 'host-1', 1, '{ok,..}', 1, '0.1.0')")
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        migrate(blank_dsn)
    message = refused.value.diag.message_primary
    assert "queues.name 'evil/../q2'" in message and "cron_jobs 'nightly': queue 'two words'" in message
    assert "host-1" in message and "{ok,..}" in message and "\n" not in message
    assert "nothing was changed" in refused.value.diag.message_hint
    assert scalar(blank_dsn, "SELECT max(version) FROM queueworker.schema_migrations") < 14, "014 was not applied"
    assert query(blank_dsn, "SELECT name FROM queueworker.queues ORDER BY name") == [(BAD,), ("q2",)]
    assert scalar(blank_dsn, "SELECT queue FROM queueworker.cron_jobs") == "two words"

    with psycopg.connect(blank_dsn, autocommit=True) as conn:  # what the hint says: the operator decides
        conn.execute("DELETE FROM queueworker.queues WHERE name = %s", (BAD,))
        conn.execute("UPDATE queueworker.cron_jobs SET queue = 'two-words'")
        conn.execute("DELETE FROM queueworker.workers")
    migrate(blank_dsn)
    assert scalar(blank_dsn, "SELECT max(version) FROM queueworker.schema_migrations") >= 14
    assert query(blank_dsn, "SELECT queue FROM queueworker.queue_events WHERE queue = %s ORDER BY id", (BAD,)), \
        "the audit trail keeps what happened under the old name"
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        for statement, value in (("INSERT INTO queueworker.queues (name) VALUES (%s)", BAD),
                                 ("UPDATE queueworker.cron_jobs SET queue = %s", "a/b"),
                                 ("INSERT INTO queueworker.workers (id, hostname, pid, queues, concurrency, version) "
                                  "VALUES (gen_random_uuid(), 'h', 1, %s, 1, '0')", ["ok", None]),
                                 ("INSERT INTO queueworker.queue_events (queue, change, detail) "
                                  "VALUES (%s, 'x', '{}')", "a b")):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(statement, (value,))
        conn.execute("INSERT INTO queueworker.workers (id, hostname, pid, queues, concurrency, version) "
                     "VALUES (gen_random_uuid(), 'h', 1, %s, 1, '0')", (["emails", "a.b:c-d_e", "x" * 128],))

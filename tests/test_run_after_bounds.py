"""Migration 015: a task is due at a time every reader can handle. A run_after of -infinity or
infinity (or past what Python's datetime holds), written through SQL, broke `queueworker status`,
the controller's depth read of every queue read with it and the promotion of due tasks. It is
refused now; a database holding such rows keeps them, due as near their meaning as a readable time
allows."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import psycopg
import pytest
from pydantic import ValidationError

from queueworker import cli
from queueworker.client import producer
from queueworker.client.producer import TaskSpec
from queueworker.migrate import migrate
from tests.schema_history import migrate_to
from tests.support import query, scalar

pytestmark = pytest.mark.integration

UNREADABLE = ["-infinity", "infinity", "10000-01-01", "0001-01-01"]


@pytest.mark.parametrize("run_after", UNREADABLE)
def test_an_unreadable_run_after_is_refused_however_it_is_written(dsn, run_after):
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match="run_after_readable"):
            conn.execute("INSERT INTO queueworker.tasks (queue, task, run_after) VALUES ('default', 't', %s)",
                         (run_after,))
        with pytest.raises(psycopg.errors.CheckViolation, match="run_after_readable"):  # the producer's function
            conn.execute("SELECT * FROM queueworker.enqueue_tasks('{default}', '{t}', '{\"{}\"}', '{0}', %s, '{3}', "
                         "'{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')", ([run_after],))
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 0


def test_rows_from_before_keep_their_meaning_and_every_reader_works_again(blank_dsn, capsys):
    migrate_to(blank_dsn, 12)
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        ids = [conn.execute("INSERT INTO queueworker.tasks (queue, task, run_after) VALUES ('q', 't', %s) "
                            "RETURNING id", (run_after,)).fetchone()[0] for run_after in UNREADABLE]
    migrate(blank_dsn)
    rows = dict(query(blank_dsn, "SELECT id, run_after <= created_at FROM queueworker.tasks"))
    assert [rows[i] for i in ids] == [True, False, False, True], "due at once stays due; never stays far away"
    assert scalar(blank_dsn, "SELECT count(*) FROM queueworker.tasks WHERE run_after > '9999-01-01'") == 2
    assert cli.main(["status", "--json", "--dsn", blank_dsn]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["queues"]["q"]["pending"] == 4, report


@pytest.mark.parametrize("run_after", [datetime(9999, 12, 31, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)])
def test_the_api_refuses_what_the_database_would_before_connecting(run_after):
    with pytest.raises(ValidationError, match="run_after must lie from 0002-01-01 to 9999-12-30"):
        TaskSpec(task="t", run_after=run_after)
    with pytest.raises(ValidationError, match="run_after must lie"):  # the plain fast path falls back to TaskSpec
        list(producer._batches([{"task": "t", "run_after": run_after}]))

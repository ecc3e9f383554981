"""Task keys (migration 018): what a task belongs to within its queue. Every way a task is made stores
its key (plain, with headers, the COPY path, unique, dependent, chained, a run's partitions and its
consolidation, a continued task's next page, a cron slot), the producer, the CLI and the database
refuse keys that are not printable text of 1 to 256 characters in one line, and `show`, `list` and
the console show them, escaped."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest
from pydantic import ValidationError

from queueworker import cli, enqueue, enqueue_async, enqueue_chain, enqueue_many, get_task
from queueworker.cli.tables import terminal_text
from queueworker.client.cron import cron_job
from queueworker.client.producer import COPY_THRESHOLD, TaskSpec, _plain_task, start_run
from queueworker.client import producer
from queueworker.db.enqueue import (
    COPY_STAGING, COPY_STAGING_WITH_KEYS, ENQUEUE, ENQUEUE_ONE, ENQUEUE_STAGED_HASHED, ENQUEUE_STAGED_WITH_KEYS_HASHED,
    ENQUEUE_TASKS, ENQUEUE_TASKS_WITH_HEADERS, ENQUEUE_TASKS_WITH_KEYS, ENQUEUE_WITH_HEADERS, ENQUEUE_WITH_KEYS,
    STAGING_STATE, StagingStateRow)
from tests.support import WorkerProcess, query, scalar, wait_until
from tests.test_bulk_enqueue import STAGED

HOSTILE_KEYS = ["", "k" * 257, "nul\x00", "line\nbreak", "\x1b[31mred", "tab\there", "del\x7f", "c1\x85",
                "sep\u2028arator", "lone\ud800surrogate"]


def keys_of(dsn: str, ids: list[int]) -> list[str | None]:
    found = dict(query(dsn, "SELECT id, key FROM queueworker.tasks WHERE id = ANY(%s)", (ids,)))
    return [found[task_id] for task_id in ids]


# -- unit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", HOSTILE_KEYS, ids=repr)
def test_a_key_that_is_not_printable_text_of_1_to_256_characters_is_refused_in_one_line(key):
    with pytest.raises(ValidationError) as refused:
        TaskSpec(task="t", key=key)
    assert [error["loc"] for error in refused.value.errors()] == [("key",)]
    assert _plain_task({"task": "t", "key": key}) is None, "the fast path leaves it to TaskSpec"
    with pytest.raises(ValidationError):
        cron_job("job", "* * * * *", "t", key=key)


def test_a_key_of_256_printable_characters_is_taken_as_it_is():
    key = "é" * 250 + "tenant"
    assert TaskSpec(task="t", key=key).key == key
    assert _plain_task({"task": "t", "key": key}).key == key
    assert TaskSpec(task="t").key is None and _plain_task({"task": "t"}).key is None


def test_terminal_text_escapes_what_a_terminal_would_act_on():
    assert terminal_text("tenant-a") == "tenant-a"
    assert terminal_text("a\u200bb\x1b[2J") == "a\\u200bb\\x1b[2J"


def _first_statements(batch: list, copy: bool = False) -> list:
    """The statements a batch's plan sends first: its insert, or (COPY) the staging state, the COPY and
    the insert from the staging table."""
    plan = producer._plan([TaskSpec(**spec) for spec in batch], copy=copy)
    step = next(plan)
    if step[0] is not STAGING_STATE:
        return [step[0]]
    copied = plan.send([StagingStateRow(exists=False, allowed=True, spec_hash=True)])
    return [STAGING_STATE, copied.statement, plan.send([])[0]]


def test_a_batch_without_keys_is_sent_as_before_and_one_with_keys_by_the_variants_that_store_them():
    """Batches without keys take the statements of schema version 17, which leave the column out (a
    producer of this version still enqueues them into a database not yet migrated to 18). One plain
    spec alone takes `enqueue_one`, which names every column of queueworker.new_tasks, the view of
    version 19 that a producer's plain insert needs whatever the statement (it has them all)."""
    plain, headers, keyed = {"task": "t"}, {"task": "t", "headers": {"h": "v"}}, {"task": "t", "key": "k"}
    unique = {"task": "t", "dedupe_key": "d"}
    assert _first_statements([plain]) == _first_statements([keyed]) == [ENQUEUE_ONE]
    assert _first_statements([plain, plain]) == [ENQUEUE]
    assert _first_statements([plain, headers]) == [ENQUEUE_WITH_HEADERS]
    assert _first_statements([plain, keyed]) == [ENQUEUE_WITH_KEYS]
    assert _first_statements([unique]) == [ENQUEUE_TASKS]
    assert _first_statements([{**unique, "headers": {"h": "v"}}]) == [ENQUEUE_TASKS_WITH_HEADERS]
    assert _first_statements([{**unique, "key": "k"}]) == [ENQUEUE_TASKS_WITH_KEYS]
    big = producer.COPY_THRESHOLD
    assert _first_statements([plain] * big, copy=True) == [STAGING_STATE, COPY_STAGING, ENQUEUE_STAGED_HASHED]
    assert _first_statements([plain] * (big - 1) + [keyed], copy=True) == [
        STAGING_STATE, COPY_STAGING_WITH_KEYS, ENQUEUE_STAGED_WITH_KEYS_HASHED]
    for statement in (ENQUEUE, ENQUEUE_WITH_HEADERS, ENQUEUE_TASKS, ENQUEUE_TASKS_WITH_HEADERS, COPY_STAGING,
                      ENQUEUE_STAGED_HASHED):
        assert "key" not in statement.text.replace("dedupe_key", ""), statement.name


# -- integration -----------------------------------------------------------------------------

@pytest.mark.integration
def test_every_enqueue_path_stores_the_key(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        plain = enqueue(conn, "t", {"n": 1}, key="plain")
        unkeyed = enqueue(conn, "t", {"n": 2})
        headers = enqueue(conn, "t", key="with-headers", headers={"h": "v"})
        mixed = enqueue_many(conn, [{"task": "t", "key": "dict"}, {"task": "t"},
                                    TaskSpec(task="t", key="spec", headers={"h": "v"})])
        unique = enqueue(conn, "t", key="unique", dedupe_key="d")
        duplicate = enqueue(conn, "t", key="other", dedupe_key="d")
        dependent = enqueue(conn, "t", key="dependent", depends_on=[plain])
        chain = enqueue_chain(conn, [{"task": "a", "key": "first"}, {"task": "b"}, {"task": "c", "key": "third"}])
        with conn.transaction():
            staged = enqueue_many(conn, [{"task": "t", "payload": {"n": n}, "key": f"k{n % 3}" if n % 4 else None}
                                         for n in range(COPY_THRESHOLD)])
            assert conn.execute(STAGED).fetchone()[0], "the batch went through COPY"
        run = start_run(conn, "keyed", [{"task": "p", "key": "partition"}, {"task": "p"}],
                        on_success={"task": "consolidate", "key": "consolidation"})
        twin = asyncio.run(_enqueue_async(dsn))
    assert keys_of(dsn, [plain, unkeyed, headers]) == ["plain", None, "with-headers"]
    assert keys_of(dsn, mixed) == ["dict", None, "spec"]
    assert duplicate == unique and keys_of(dsn, [unique]) == ["unique"]
    assert keys_of(dsn, [dependent]) == ["dependent"]
    assert keys_of(dsn, chain) == ["first", None, "third"]
    assert keys_of(dsn, staged) == [f"k{n % 3}" if n % 4 else None for n in range(COPY_THRESHOLD)]
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) "
                       "AND spec_hash = queueworker.spec_hash(queue, task, payload)", (staged,)) == COPY_THRESHOLD
    assert query(dsn, "SELECT run_partition, key FROM queueworker.tasks WHERE run_id = %s ORDER BY run_partition",
                 (run,)) == [(0, "partition"), (1, None)]
    assert scalar(dsn, "SELECT on_success ->> 'key' FROM queueworker.runs WHERE id = %s", (run,)) == "consolidation"
    assert keys_of(dsn, [twin]) == ["async"]
    assert get_task(psycopg.connect(dsn), plain).key == "plain"


async def _enqueue_async(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await enqueue_async(conn, "t", key="async")


@pytest.mark.integration
def test_ten_thousand_distinct_keys_in_one_batch_are_accepted(dsn):
    keys = [f"tenant-{n}-ключ" for n in range(10_000)]
    with psycopg.connect(dsn) as conn:
        ids = enqueue_many(conn, [{"task": "t", "key": key} for key in keys])
    assert keys_of(dsn, ids) == keys


@pytest.mark.integration
def test_a_consolidation_gets_its_key_when_the_run_succeeds(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        run = start_run(conn, "consolidated", [{"task": "qw.noop", "key": "p"}],
                        on_success={"task": "qw.noop", "key": "consolidation"})
    worker = WorkerProcess(dsn)
    try:
        wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.runs WHERE id = %s", (run,)) == "succeeded",
                   message="the run's consolidation")
    finally:
        worker.stop()
    assert scalar(dsn, "SELECT t.key FROM queueworker.runs r JOIN queueworker.tasks t ON t.id = r.success_task_id "
                       "WHERE r.id = %s", (run,)) == "consolidation"


@pytest.mark.integration
def test_each_page_of_a_continued_task_keeps_its_key_when_it_succeeds(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = enqueue(conn, "long.page", {"page": 0, "pages": 3, "sleep": 0}, key="tenant-a")
    worker = WorkerProcess(dsn, "--handlers", "tests.long_task_handlers")
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 3,
                   message="three pages")
    finally:
        worker.stop()
    pages = query(dsn, "SELECT id, continued_from, key FROM queueworker.tasks ORDER BY id")
    assert pages[0][0] == first and [row[1] for row in pages[1:]] == [row[0] for row in pages[:-1]]
    assert {row[2] for row in pages} == {"tenant-a"}


@pytest.mark.integration
def test_a_cron_slot_carries_its_schedule_key_and_runs_with_it(dsn, capsys):
    assert cli.main(["cron", "add", "keyed", "--dsn", dsn, "--cron", "* * * * * *", "--task", "qw.noop",
                     "--key", "tenant-cron"]) == 0
    assert cli.main(["cron", "list", "--dsn", dsn, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1])[0]["key"] == "tenant-cron"
    worker = WorkerProcess(dsn)
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded' "
                                       "AND dedupe_key LIKE 'cron:keyed:%%'") >= 1, message="a slot that ran")
    finally:
        worker.stop()
    assert {key for (key,) in query(dsn, "SELECT DISTINCT key FROM queueworker.tasks "
                                         "WHERE dedupe_key LIKE 'cron:keyed:%%'")} == {"tenant-cron"}
    assert cli.main(["cron", "add", "bad", "--dsn", dsn, "--cron", "* * * * *", "--task", "t",
                     "--key", "x" * 257]) == 2
    error = capsys.readouterr().err
    assert error.startswith("queueworker: --key") and error.count("\n") == 1


@pytest.mark.integration
def test_a_declared_schedule_writes_its_key(dsn):
    from queueworker.client.cron import add_schedule

    with psycopg.connect(dsn, autocommit=True) as conn:
        assert add_schedule(conn, cron_job("declared", "* * * * *", "t", key="tenant-d")) == "added"
        assert add_schedule(conn, cron_job("declared", "* * * * *", "t", key="tenant-e")) == "replaced"
    assert scalar(dsn, "SELECT key FROM queueworker.cron_jobs WHERE name = 'declared'") == "tenant-e"


@pytest.mark.integration
@pytest.mark.parametrize("key", ["", "k" * 257, "ctl\x01", "esc\x1b", "del\x7f", "c1\x9b", "sep\u2029"], ids=repr)
def test_the_database_refuses_a_key_written_past_the_api(dsn, key):
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO queueworker.tasks (queue, task, key) VALUES ('default', 't', %s)", (key,))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO queueworker.cron_jobs (name, expression, task, source, next_slot, key) "
                         "VALUES ('c', '* * * * *', 't', 'runtime', now(), %s)", (key,))
        with pytest.raises(psycopg.errors.CheckViolation, match="consolidation"):
            conn.execute("SELECT queueworker.start_run('r', 1, %s::jsonb, NULL, NULL, ARRAY['default'])",
                         (json.dumps({"task": "t", "key": key}),))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("SELECT * FROM queueworker.enqueue_tasks(ARRAY['default'], ARRAY['t'], ARRAY['{}'::jsonb], "
                         "ARRAY[0], ARRAY[NULL::timestamptz], ARRAY[10], ARRAY[NULL::int], ARRAY['d'], ARRAY[false], "
                         "ARRAY[true], '{}', '{}', ARRAY[NULL::bigint], ARRAY[NULL::int], ARRAY[NULL::jsonb], "
                         "ARRAY[%s])", (key,))
        # A NUL never reaches it: Postgres text holds none, and psycopg refuses to send one.
        with pytest.raises(psycopg.DataError):
            conn.execute("INSERT INTO queueworker.tasks (queue, task, key) VALUES ('default', 't', %s)", (key + "\x00",))
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 0


@pytest.mark.integration
@pytest.mark.parametrize("key", ["", "k" * 257, "nul\x00", "line\nbreak", "\x1b[31m"], ids=repr)
def test_cli_enqueue_refuses_a_bad_key_in_one_line(dsn, capsys, key):
    assert cli.main(["enqueue", "t", "--dsn", dsn, "--key", key]) == 2
    error = capsys.readouterr().err
    assert error.startswith("queueworker: --key") and error.count("\n") == 1
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 0


@pytest.mark.integration
def test_cli_enqueues_with_a_key_and_show_and_list_show_it_escaped_and_cut(dsn, capsys):
    assert cli.main(["enqueue", "report", "--dsn", dsn, "--key", "tenant-a", "-q"]) == 0
    keyed = int(capsys.readouterr().out)
    long_key = "customer-" + "x" * 200
    with psycopg.connect(dsn, autocommit=True) as conn:
        unkeyed = enqueue(conn, "report")
        enqueue(conn, "report", key=long_key)
        # A key the API refuses but the database's check lets by (a zero-width space): shown escaped.
        sneaky = conn.execute("INSERT INTO queueworker.tasks (queue, task, key) VALUES ('default', 'report', %s) "
                              "RETURNING id", ("a\u200bb",)).fetchone()[0]
    assert cli.main(["show", str(keyed), "--dsn", dsn]) == 0
    assert "  key:            tenant-a\n" in capsys.readouterr().out
    assert cli.main(["show", str(unkeyed), "--dsn", dsn]) == 0
    assert "key:" not in capsys.readouterr().out
    assert cli.main(["show", str(sneaky), "--dsn", dsn]) == 0
    assert "key:            a\\u200bb\n" in capsys.readouterr().out
    assert cli.main(["show", str(keyed), "--dsn", dsn, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == "tenant-a"
    assert cli.main(["list", "--dsn", dsn]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "KEY" and all(len(line) <= 80 for line in lines)
    assert lines[1].endswith("a\\u200bb") and "customer-xxx" in lines[2] and lines[2].endswith("…")
    assert lines[3].endswith("0/10") and lines[4].endswith("tenant-a")
    assert cli.main(["list", "--dsn", dsn, "--json"]) == 0
    assert [row["key"] for row in json.loads(capsys.readouterr().out)] == ["a\u200bb", long_key, None, "tenant-a"]


@pytest.mark.integration
def test_the_console_shows_a_task_key_escaped_on_the_task_page_and_in_the_list(dsn):
    from tests.test_console import client

    with psycopg.connect(dsn, autocommit=True) as conn:
        keyed = enqueue(conn, "report", key="<b>tenant</b> & co")
        unkeyed = enqueue(conn, "report")
    with client(dsn) as c:
        page = c.get(f"/tasks/{keyed}").text
        assert '<td id="key">&lt;b&gt;tenant&lt;/b&gt; &amp; co</td>' in page and "<b>tenant" not in page
        assert 'id="key"' not in c.get(f"/tasks/{unkeyed}").text
        listing = c.get("/tasks").text
        assert "<th>Key</th>" in listing and "<td>&lt;b&gt;tenant&lt;/b&gt; &amp; co</td>" in listing


@pytest.mark.integration
def test_a_handler_is_told_its_tasks_key_in_a_plain_and_in_a_keyed_queue(dsn):
    """ctx.key, through a real worker's claim (queueworker.testing.drain): the plain claim of a queue
    no keyed task reached and the fair claim of one that is keyed."""
    from queueworker import Registry
    from queueworker.testing import drain

    registry = Registry()

    @registry.task(name="which")
    def which(payload, ctx):
        return {"key": ctx.key}

    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue(conn, "which", queue="plain")
        enqueue_many(conn, [{"task": "which", "queue": "keyed", "key": "tenant-7"},
                            {"task": "which", "queue": "keyed"}])
        ran = drain(conn, registry=registry)
    assert sorted((task.queue, task.result["key"] or "") for task in ran) == [
        ("keyed", ""), ("keyed", "tenant-7"), ("plain", "")]

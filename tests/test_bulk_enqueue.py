"""The producer's fast path for big batches: plain dicts checked without pydantic (never more
leniently than TaskSpec), and plain specs sent with COPY through a staging table, storing exactly
the rows, ids, audit rows and wake-ups of the plain INSERT."""

from __future__ import annotations

import asyncio
import math
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError

from queueworker import TaskSpec, enqueue_many
from queueworker.cli import main as cli_main
from queueworker.client import producer
from queueworker.client.producer import COPY_THRESHOLD, enqueue_batch, enqueue_many_async
from queueworker.db.enqueue import COPY_STAGING
from queueworker.names import INT4_MAX
from queueworker.settings import WorkerSettings
from queueworker.runtime.worker import Worker
from tests.support import builtin_registry, query, run_worker_until, scalar, until

# Whether the transaction has a staging table: whether a batch of it went through COPY.
STAGED = "SELECT to_regclass('pg_temp.queueworker_staged_tasks') IS NOT NULL"
# Everything a task row holds but its id and the times the database gives it; run_after as its
# distance from created_at (a delay is counted from the producer's clock), rounded to minutes.
ROW = """
SELECT queue, task, state::text, delayed, priority, attempts, max_attempts, rescues, timeout_seconds, payload,
       result, error, lease_owner, lease_token, leased_until, deadline_at, started_at, finished_at, spec_hash,
       dedupe_key, run_id, run_partition, progress, checkpoint, continued_from, notify_on_finish, headers, key,
       -- a due time given as a date is compared as it is; one given as a delay, from the row's own
       -- creation (the two enqueues compared run at different moments)
       CASE WHEN abs(extract(epoch FROM run_after - created_at)) > 86400 THEN run_after::text
            ELSE round(extract(epoch FROM run_after - created_at) / 60)::text END AS due, created_at = updated_at
FROM queueworker.tasks WHERE id = ANY(%s) ORDER BY id
"""


def _varied_specs(count: int) -> list:
    """`count` plain specs using every field a plain spec has, in the shapes callers pass them."""
    berlin = timezone(timedelta(hours=1))
    shapes = [
        lambda n: {"task": "plain"},
        lambda n: {"task": f"näme\\{n}", "payload": {"n": n, "text": "tab\tnew\nline \\ \"q\" é \u2028 \U0001f600"}},
        lambda n: {"task": "t", "queue": f"q.{n % 5}:x-y_z", "priority": INT4_MAX, "max_attempts": 1000},
        lambda n: {"task": "t", "priority": -(2**31), "timeout_seconds": INT4_MAX, "payload": [2**80, -1.5e300, None]},
        lambda n: {"task": "t", "delay": 3600, "payload": "\\u0000 as text"},
        lambda n: {"task": "t", "delay": 90.5},
        lambda n: {"task": "t", "run_after": datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=berlin)},
        lambda n: {"task": "t", "run_after": datetime(2001, 1, 1, tzinfo=timezone.utc), "payload": True},
        lambda n: TaskSpec(task="typed", payload={"n": n}, headers={"traceparent": f"00-{n}", "x": ""}),
        lambda n: TaskSpec(task="notify", notify_on_finish=True),
        lambda n: {"task": "coerced", "priority": "7", "delay": "60"},  # left to TaskSpec, which converts
        lambda n: {"task": "t", "payload": None, "timeout_seconds": None, "run_after": None},
        lambda n: {"task": "t", "key": f"tenant-{n % 7} é \U0001f600"},
        lambda n: TaskSpec(task="typed", key="k" * 256, headers={"x": "y"}),
    ]
    return [shapes[n % len(shapes)](n) for n in range(count)]


def _enqueued_rows(dsn: str, specs: list, threshold: int) -> tuple[list[tuple], bool]:
    """Enqueues `specs` in one transaction with the given COPY threshold; their rows, and whether
    that transaction had a staging table."""
    with psycopg.connect(dsn) as conn:
        original, producer.COPY_THRESHOLD = producer.COPY_THRESHOLD, threshold
        try:
            ids = enqueue_many(conn, specs)
        finally:
            producer.COPY_THRESHOLD = original
        staged = conn.execute(STAGED).fetchone()[0]
    assert len(ids) == len(specs) == len(set(ids))
    assert ids == sorted(ids), "ids in spec order"
    return query(dsn, ROW, (ids,)), staged


@pytest.mark.integration
def test_copy_stores_exactly_the_rows_the_plain_insert_stores(dsn):
    specs = _varied_specs(COPY_THRESHOLD + 200)
    # The slow path as it was: every dict validated by pydantic, every row bound as array parameters.
    validated = [spec if isinstance(spec, TaskSpec) else TaskSpec(**spec) for spec in specs]
    slow, slow_staged = _enqueued_rows(dsn, validated, threshold=10**9)
    fast, fast_staged = _enqueued_rows(dsn, specs, threshold=COPY_THRESHOLD)
    assert (slow_staged, fast_staged) == (False, True), "the big batch went through COPY, the other not"
    assert fast == slow
    assert len({row[0] for row in fast}) == 6 and any(row[26] for row in fast) and any(row[25] for row in fast)
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE spec_hash <> "
                       "queueworker.spec_hash(queue, task, payload)") == 0
    # One audit row per task, as the insert trigger writes it.
    assert query(dsn, """SELECT from_state, to_state::text, worker, lease_token, detail, count(*)
                         FROM queueworker.task_events GROUP BY 1, 2, 3, 4, 5""") == \
        [(None, "pending", None, 0, None, 2 * len(specs))]


@pytest.mark.integration
def test_copy_is_used_below_the_caller_transaction_and_on_autocommit(dsn):
    specs = [{"task": "t", "payload": {"n": n}} for n in range(COPY_THRESHOLD)]
    with psycopg.connect(dsn) as conn:
        first = enqueue_many(conn, specs)
        second = enqueue_many(conn, specs)  # the transaction's staging table, emptied and reused
        assert conn.execute(STAGED).fetchone()[0]
        conn.rollback()
        assert not conn.execute(STAGED).fetchone()[0], "dropped with the transaction"
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 0, "rolled back with the caller's transaction"
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = enqueue_many(conn, specs)
        assert not conn.execute(STAGED).fetchone()[0]
    assert len(first) == len(second) == len(ids) == COPY_THRESHOLD
    assert query(dsn, "SELECT payload->'n' FROM queueworker.tasks ORDER BY id") == [(n,) for n in range(len(specs))]


@pytest.mark.integration
def test_a_big_batch_in_pipeline_mode_takes_the_plain_insert(dsn):
    """Pipeline mode has no COPY: the batch is inserted as it was before COPY."""
    specs = [{"task": "t", "payload": {"n": n}} for n in range(COPY_THRESHOLD)]
    for autocommit in (False, True):
        with psycopg.connect(dsn, autocommit=autocommit) as conn:
            with conn.pipeline():
                ids = enqueue_many(conn, specs)
            assert len(ids) == len(specs) and not conn.execute(STAGED).fetchone()[0]
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 2 * len(specs)


@pytest.mark.integration
def test_the_async_producer_takes_the_copy_path_too(dsn):
    async def main() -> tuple[list[int], bool]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            ids = await enqueue_many_async(conn, [{"task": "t", "payload": {"n": n}} for n in range(COPY_THRESHOLD)])
            staged = (await (await conn.execute(STAGED)).fetchone())[0]
            await conn.commit()
            return ids, staged
    ids, staged = asyncio.run(main())
    assert staged
    assert query(dsn, "SELECT id, payload->'n' FROM queueworker.tasks ORDER BY id") == \
        [(task_id, n) for n, task_id in enumerate(ids)]


@pytest.mark.integration
def test_unique_specs_in_a_big_batch_deduplicate_as_before(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        (held,) = enqueue_many(conn, [{"task": "t", "dedupe_key": "held", "payload": {"v": 1}}])
    batch = [TaskSpec(task="t", payload={"n": n}) for n in range(COPY_THRESHOLD)]
    batch[10:10] = [TaskSpec(task="t", dedupe_key="k", payload={"v": 1}),
                    TaskSpec(task="t", dedupe_key="held", payload={"v": 2}, on_conflict="replace"),
                    TaskSpec(task="t", dedupe_key="k", payload={"v": 3})]
    with psycopg.connect(dsn) as conn:
        outcome = enqueue_batch(conn, batch)
        assert conn.execute(STAGED).fetchone()[0]
    ids = outcome.ids
    assert outcome.duplicates == [11, 12]
    assert ids[11] == held and ids[12] == ids[10] and len(set(ids)) == len(batch) - 1
    assert query(dsn, "SELECT payload FROM queueworker.tasks WHERE id = ANY(%s) ORDER BY id", ([held, ids[10]],)) \
        == [({"v": 2},), ({"v": 1},)], "the held task replaced, the one of the batch kept its first payload"
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 1 + len(batch) - 2


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.integration
@pytest.mark.parametrize("bad, message", [
    ({"payload": {"x": math.nan}}, "NaN and Infinity"),
    ({"payload": {"x": "a\x00b"}}, "NUL character"),
    ({"payload": _nested(100_000)}, "nested too deeply"),
    ({"payload": 10**5000}, "4,300 digits"),
    ({"task": "a\x00b"}, "printable"),
    ({"queue": "mail\n"}, "should match pattern"),
    ({"priority": INT4_MAX + 1}, "less than or equal to 2147483647"),
    ({"delay": math.inf}, "finite number"),
    ({"max_attempts": True, "timeout_seconds": 0}, "greater than 0"),
])
def test_bad_input_in_the_middle_of_a_big_batch_inserts_nothing(dsn, bad, message):
    specs = [{"task": "t", "payload": {"n": n}} for n in range(3 * COPY_THRESHOLD)]
    specs[len(specs) // 2] = {"task": "t", **bad}
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(ValidationError, match=message):
            enqueue_many(conn, specs)
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 0


@pytest.mark.integration
def test_bad_input_after_a_copied_batch_leaves_nothing_once_the_transaction_rolls_back(dsn, monkeypatch):
    monkeypatch.setattr(producer, "COPY_BATCH_SIZE", COPY_THRESHOLD)
    specs = [{"task": "t"} for _ in range(3 * COPY_THRESHOLD)] + [{"task": "t", "payload": math.nan}]
    with pytest.raises(ValidationError, match="NaN and Infinity"):
        with psycopg.connect(dsn) as conn:
            try:
                enqueue_many(conn, specs)
            finally:
                assert conn.execute(STAGED).fetchone()[0], "the first batches went through COPY"
                assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 0, "not visible before commit"
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 0


@pytest.mark.integration
def test_a_copied_batch_wakes_a_listening_worker(dsn):
    """The worker polls only every 10 minutes: only the enqueue's NOTIFY can have it run the tasks."""
    settings_ = WorkerSettings(concurrency=8, scheduler_max_interval_seconds=600, poll_interval_seconds=600)
    with psycopg.connect(dsn, autocommit=True) as conn:
        (first,) = enqueue_many(conn, [{"task": "qw.noop"}])

    def done(ids: list[int]) -> bool:
        return scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) AND state = 'succeeded'",
                      (ids,)) == len(ids)

    async def main() -> list[int]:
        worker = Worker(dsn, settings_, builtin_registry())
        running = asyncio.create_task(run_worker_until(worker, lambda: bool(ids) and done(ids), timeout=120))
        await until(lambda: asyncio.to_thread(done, [first]), 120,  # the worker is up, listening, and idle again
                    "the first task to succeed", interval=0.1)
        with psycopg.connect(dsn) as conn:
            ids.extend(enqueue_many(conn, [{"task": "qw.noop"} for _ in range(COPY_THRESHOLD)]))
            assert conn.execute(STAGED).fetchone()[0]
        await running
        return ids

    ids: list[int] = []
    assert len(asyncio.run(main())) == COPY_THRESHOLD


@pytest.mark.integration
def test_a_copied_batch_due_later_announces_its_earliest_due_time(dsn):
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN queueworker")
        with psycopg.connect(dsn) as conn:
            enqueue_many(conn, [{"task": "t", "queue": "later", "delay": 3600 + n} for n in range(COPY_THRESHOLD)])
            assert conn.execute(STAGED).fetchone()[0]
        (notify,) = list(listener.notifies(timeout=30, stop_after=1))
    earliest = scalar(dsn, "SELECT extract(epoch FROM min(run_after))::text FROM queueworker.tasks")
    assert notify.payload == f"later {earliest}"


@pytest.mark.integration
def test_the_cli_sends_many_copies_with_copy(dsn, monkeypatch, capsys):
    statements = []
    real_copy = psycopg.Cursor.copy

    def spying_copy(self, statement, *args, **kwargs):
        statements.append(statement)
        return real_copy(self, statement, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "copy", spying_copy)
    assert cli_main(["enqueue", "-q", "qw.noop", "--dsn", dsn, "--count", str(COPY_THRESHOLD + 1)]) == 0
    ids = [int(line) for line in capsys.readouterr().out.split()]
    assert statements == [COPY_STAGING.text]
    assert len(ids) == COPY_THRESHOLD + 1 and ids == sorted(ids)
    assert query(dsn, "SELECT count(*) FROM queueworker.task_events WHERE task_id = ANY(%s) AND to_state = 'pending'",
                 (ids,)) == [(len(ids),)]


def test_the_fast_check_takes_the_common_shapes():
    plain = [spec for spec in _varied_specs(12) if isinstance(spec, dict) and spec["task"] != "coerced"]
    assert len(plain) == 9
    assert all(isinstance(producer._plain_task(spec), producer.PlainTask) for spec in plain)
    assert producer._plain_task({"task": "coerced", "priority": "7"}) is None


_VALUES = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
           | st.datetimes(timezones=st.none() | st.just(timezone.utc) | st.timezones())
           | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_FIELDS = {
    "task": st.text(max_size=210) | _VALUES,
    "payload": st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                            lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=8),
    "queue": st.from_regex(producer.QUEUE_PATTERN) | st.text(max_size=130) | _VALUES,
    "priority": st.integers(-(2**32), 2**32) | _VALUES,
    "run_after": _VALUES,
    "delay": st.floats(-1, 2.0 * INT4_MAX) | st.integers(-1, 2 * INT4_MAX) | _VALUES,
    "max_attempts": st.integers(-1, 1001) | _VALUES,
    "timeout_seconds": st.integers(-1, 2 * INT4_MAX) | _VALUES,
    "headers": _VALUES,
    "dedupe_key": _VALUES,
    "key": st.text(max_size=260) | st.sampled_from(["", "k" * 256, "k" * 257, "\x00", "a\u2028b"]) | _VALUES,
}


@settings(max_examples=2000, deadline=None)
@given(values=st.fixed_dictionaries({}, optional=_FIELDS))
def test_the_fast_check_never_accepts_what_taskspec_refuses_nor_stores_it_differently(values):
    checked = producer._plain_task(values)
    try:
        spec = TaskSpec(**values)
    except ValidationError:
        assert checked is None, values
        return
    if checked is None:
        return  # left to TaskSpec, as any unusual input is
    now = datetime.now(timezone.utc)
    assert spec.plain and not spec.notify_on_finish and spec.headers is None
    assert (checked.task, checked.payload_json, checked.queue, checked.priority, checked.max_attempts,
            checked.timeout_seconds, checked.key, checked.due_at(now)) == \
        (spec.task, spec.payload_json, spec.queue, spec.priority, spec.max_attempts, spec.timeout_seconds,
         spec.key, spec.due_at(now))

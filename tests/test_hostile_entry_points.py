"""Hostile values through every producer and operator entry point, as the roles that use them.

Property-based (derandomised, a fixed number of examples): hypothesis draws values a careless or
hostile caller could send (NaN and infinities, integers past every column, NUL bytes, lone
surrogates, control characters, text of 100,000 characters, JSON nested 3,000 deep, timestamps at
the ends of time) into the Python API (enqueue, enqueue_many, start_run, cancel, retry, pause,
set_limits, set_breaker, cron schedules), the CLI, and the SQL functions a producer may call, each
as its role of docs/database-roles.sql. Each call either works or is refused with a clear error:
pydantic's ValidationError or a ValueError, a CLI line `queueworker: ...` with exit 2 or 1, or a
database error of the caller's own (data, constraint, permission, a raised exception), never a
crash of ours. Afterwards other work is unaffected: the duties' statements, `queueworker status`
and the controller's depth read still run, and a trusted producer's tasks are run by a real worker
exactly once (integration tier).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from queueworker import cli
from queueworker.client import cron, operations
from queueworker.client.producer import enqueue, enqueue_many, start_run
from tests.support import WorkerProcess, assert_each_succeeded_once, query, wait_until
from tests.test_roles import Installation, installation  # noqa: F401 (installation: a fixture)

pytestmark = pytest.mark.integration

# The database's own refusals of a caller's values: data exceptions, integrity constraints,
# permissions and undefined objects, program limits, and exceptions our functions raise.
CALLERS_FAULT = ("22", "23", "42", "54", "P0")
EXAMPLES = 100

DEEP = "[" * 3000 + "]" * 3000
HOSTILE_TEXT = st.one_of(
    st.text(max_size=40), st.sampled_from(["", " ", "\x00", "a\x00b", "\ud800", "\x1b[31m", "x" * 100_000,
                                           "evil/../q2", "Mars/Olympus", "a" * 129]),
)
# Each value is hostile or an ordinary one, so that one bad field meets otherwise good calls.
TEXT = st.one_of(st.sampled_from(["default", "billing.eu", "qw.noop", "nightly"]), HOSTILE_TEXT)
NUMBER = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 5, 2**31, 2**63, math.nan, math.inf, -math.inf, 1e308]),
)
JSON = st.recursive(st.one_of(st.none(), st.booleans(), NUMBER, TEXT),
                    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
                    max_leaves=12)
WHEN = st.one_of(st.none(), st.sampled_from([datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC),
                                            datetime(2026, 1, 1)]), st.datetimes(timezones=st.just(UTC)))
SPEC = st.fixed_dictionaries({"task": TEXT}, optional={
    "payload": st.one_of(JSON, st.just(DEEP)), "queue": TEXT, "priority": NUMBER, "run_after": WHEN,
    "delay": NUMBER, "max_attempts": NUMBER, "timeout_seconds": NUMBER, "dedupe_key": TEXT,
    "headers": st.dictionaries(TEXT, TEXT, max_size=3), "notify_on_finish": st.booleans(), "key": TEXT})
EXPRESSION = st.one_of(st.sampled_from(["* * * * *", "0 3 * * *", "@hourly", "*/0 * * * *", "60 * * * *"]),
                       HOSTILE_TEXT)
ZONE = st.one_of(st.sampled_from(["UTC", "Europe/Paris"]), HOSTILE_TEXT)
ARG = TEXT.filter(lambda t: "\x00" not in t)  # a command line cannot hold NUL
NUMBER_ARG = st.one_of(NUMBER.map(str), ARG)
COMMAND_LINE = st.one_of(
    st.tuples(st.just("enqueue"), ARG, st.just("--queue"), ARG, st.just("--payload"), ARG,
              st.just("--priority"), NUMBER_ARG, st.just("--key"), ARG),
    st.tuples(st.just("cancel"), NUMBER_ARG),
    st.tuples(st.just("retry"), NUMBER_ARG),
    st.tuples(st.just("pause"), ARG, st.just("--for"), ARG),
    st.tuples(st.just("limit"), ARG, st.just("--rate"), ARG, st.just("--concurrency"), NUMBER_ARG),
    st.tuples(st.just("breaker"), ARG, st.just("--failures"), NUMBER_ARG),
    st.tuples(st.just("cron"), st.just("add"), ARG, st.just("--cron"), EXPRESSION.filter(lambda t: "\x00" not in t),
              st.just("--task"), ARG, st.just("--timezone"), ZONE.filter(lambda t: "\x00" not in t)),
    st.tuples(st.just("list"), st.just("--queue"), ARG),
    st.tuples(st.just("show"), NUMBER_ARG),
).map(list)

CALLS = st.one_of(
    st.tuples(st.just("enqueue"), SPEC),
    st.tuples(st.just("enqueue_many"), st.lists(SPEC, min_size=1, max_size=3)),
    st.tuples(st.just("start_run"), st.tuples(TEXT, st.lists(SPEC, min_size=1, max_size=3), st.none() | TEXT)),
    st.tuples(st.just("cancel"), st.one_of(NUMBER, TEXT)),
    st.tuples(st.just("retry"), st.one_of(NUMBER, TEXT)),
    st.tuples(st.just("pause"), st.tuples(TEXT, st.none() | NUMBER)),
    st.tuples(st.just("set_limits"), st.tuples(TEXT, st.none() | NUMBER, st.none() | NUMBER, st.none() | NUMBER)),
    st.tuples(st.just("set_breaker"), st.tuples(TEXT, st.none() | NUMBER, st.none() | NUMBER)),
    st.tuples(st.just("cron"), st.tuples(TEXT, EXPRESSION, TEXT, JSON, TEXT, ZONE)),
    st.tuples(st.just("cli"), COMMAND_LINE),
    # Text a client of another language can send: Postgres text holds no NUL, UTF-8 no lone surrogate.
    st.tuples(st.just("sql_enqueue"), st.tuples(*[TEXT.filter(lambda t: not {"\x00", "\ud800"} & set(t))] * 2,
                                                NUMBER, WHEN)),
    # The SQL producer API: specs as the JSON a client of another language sends (times as text).
    st.tuples(st.just("sql_producer"), st.lists(SPEC, min_size=1, max_size=3)),
)


def call(logins: dict[str, str], name: str, args: Any) -> None:
    """One call, as the role that makes it; raises what the entry point raises."""
    role = "producer" if name in ("enqueue", "enqueue_many", "start_run", "sql_enqueue", "sql_producer") else "operator"
    if name == "cli":
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = cli.main([*args, "--dsn", logins["operator"]])
            except SystemExit as exc:  # argparse
                code = exc.code
        lines = stderr.getvalue().splitlines()
        clean = code == 0 or (len(lines) == 1 and lines[0].startswith("queueworker: ")) or (
            code == 2 and lines[-1:] and lines[-1].startswith("queueworker "))  # argparse: usage, then one line
        assert code in (0, 1, 2) and clean, stderr.getvalue()[-2000:]
        return
    with psycopg.connect(logins[role]) as conn:
        if name == "enqueue":
            enqueue(conn, **args)
        elif name == "enqueue_many":
            enqueue_many(conn, args)
        elif name == "sql_producer":
            conn.execute("SELECT queueworker.enqueue_many(%s::jsonb)", (json.dumps(args, default=str),))
        elif name == "start_run":
            run_name, partitions, watermark = args
            start_run(conn, run_name, partitions, watermark=watermark)
        elif name == "cancel":
            operations.cancel(conn, args)
        elif name == "retry":
            operations.retry(conn, args)
        elif name == "pause":
            operations.pause(conn, args[0], seconds=args[1])
        elif name == "set_limits":
            operations.set_limits(conn, args[0], rate_per_second=args[1], burst=args[2], max_running=args[3])
        elif name == "set_breaker":
            operations.set_breaker(conn, args[0], failures=args[1], cooldown_seconds=args[2])
        elif name == "cron":
            cron.add_schedule(conn, cron.cron_job(args[0], args[1], args[2], args[3], queue=args[4], timezone=args[5]))
        elif name == "sql_enqueue":  # a producer in another language, straight at the definer function
            queue, task, priority, run_after = args
            conn.execute("SELECT * FROM queueworker.enqueue_tasks(ARRAY[%s], ARRAY[%s], '{\"{}\"}', ARRAY[%s::int], "
                         "ARRAY[%s::timestamptz], '{3}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')",
                         (queue, task, priority if isinstance(priority, int) else 0, run_after))


def refused_cleanly(exc: BaseException) -> bool:
    if isinstance(exc, (ValidationError, ValueError)) and not isinstance(exc, UnicodeError):
        return True
    return isinstance(exc, psycopg.Error) and exc.sqlstate is not None and exc.sqlstate[:2] in CALLERS_FAULT


@pytest.fixture
def logins(installation: Installation) -> dict[str, str]:  # noqa: F811 - the fixture imported above
    installation.install()
    return installation.logins


def test_hostile_values_through_every_entry_point_are_refused_cleanly_and_hurt_no_other_work(logins):
    seen: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(calls=st.lists(CALLS, min_size=1, max_size=4))
    def calls_are_refused_cleanly(calls):
        for name, args in calls:
            seen.append(name)
            try:
                call(logins, name, args)
            except Exception as exc:  # noqa: BLE001 - the property: only clean refusals
                assert refused_cleanly(exc), f"{name}{args!r:.300}: {type(exc).__name__}: {exc!s:.500}"

    calls_are_refused_cleanly()
    assert {"enqueue", "start_run", "cli", "sql_enqueue", "sql_producer", "cron"} <= set(seen), "every kind of entry point drawn"

    # Other work is unaffected: every reader and duty copes with whatever was accepted, and a trusted
    # producer's tasks run exactly once on a real worker.
    assert cli.main(["status", "--dsn", logins["operator"]]) == 0
    with psycopg.connect(logins["producer"]) as conn:
        ids = enqueue_many(conn, [{"task": "qw.noop", "queue": "canary"}] * 5)
    worker = WorkerProcess(logins["worker"], "--queue", "canary", "--rescue-interval-seconds", "1")
    try:
        wait_until(lambda: query(logins["operator"], "SELECT count(*) FROM queueworker.tasks WHERE id = ANY(%s) "
                                                     "AND state = 'succeeded'", (ids,))[0][0] == len(ids),
                   message="the canary tasks done")
    finally:
        worker.stop()
    assert_each_succeeded_once(logins["operator"], ids)
    assert "Traceback" not in worker.log() and "unexpected" not in worker.log().lower(), worker.log()[-3000:]

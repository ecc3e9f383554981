"""The SQL producer API (migrations/functions/65_sql_producer.sql, docs/producers.md), for real:
`queueworker.enqueue` and `queueworker.enqueue_many` accept and refuse exactly what TaskSpec does
and store the same rows (a property test drives both with the same values); unique tasks,
dependencies, keys, headers and finish notifications work through SQL as through Python, with
the same wake-ups; queue grants bind real producer logins of docs/database-roles.sql; a listening
worker process runs an SQL-enqueued task without polling; and the Node (`pg`) and Go (`pgx`)
examples enqueue tasks that a real worker runs, and read their results back with
`queueworker.task_status`."""

from __future__ import annotations

import json
import math
import select
import unicodedata
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from queueworker.client.producer import TaskSpec, enqueue, enqueue_many
from queueworker.names import EARLIEST_RUN_AFTER, INT4_MAX, LATEST_RUN_AFTER, QUEUE_PATTERN
from tests.producer_examples import run_go_example, run_node_example
from tests.support import FAST_LEASES, WorkerProcess, query, scalar, wait_until
from tests.test_queue_grants import as_operator, tenants, user
from tests.test_roles import Installation, installation  # noqa: F401 (installation: a fixture)

pytestmark = pytest.mark.integration

# A refusal of the value itself: the function's check (22023), or the value not being of the
# argument's type at all (a number out of bigint's range 22003, JSON Postgres does not take 22P02
# and 22P05, a time out of range 22008).
REFUSED_VALUE = {"22023", "22003", "22P02", "22P05", "22008"}
# The SQL argument types of TaskSpec's fields, as a producer in another language passes them.
SQL_TYPES = {"task": "text", "payload": "jsonb", "queue": "text", "priority": "bigint", "run_after": "timestamptz",
             "delay": "float8", "max_attempts": "bigint", "timeout_seconds": "bigint", "dedupe_key": "text",
             "dedupe": "text", "on_conflict": "text", "key": "text", "depends_on": "bigint[]",
             "on_dependency_failure": "text", "headers": "jsonb", "notify_on_finish": "boolean"}
# A task's row but its id and the times the database gives it; `due` is run_after when a spec sets
# it, whether the task was due at its creation when it sets neither, and left out with a delay,
# which counts from each side's clock (the producer's, the database's).
ROW = """
SELECT t.queue, t.task, t.state::text, t.priority, t.attempts, t.max_attempts, t.timeout_seconds, t.payload,
       t.spec_hash, t.dedupe_key, t.notify_on_finish, t.headers, t.key, t.created_at = t.updated_at,
       CASE WHEN %(delayed)s THEN NULL WHEN %(explicit)s THEN t.run_after::text
            ELSE (t.run_after = t.created_at)::text END AS due,
       CASE WHEN %(delayed)s THEN NULL ELSE t.delayed END AS delayed,
       ARRAY(SELECT d.prerequisite_id || ':' || d.cancel_on_failure FROM queueworker.task_dependencies d
             WHERE d.task_id = t.id ORDER BY d.prerequisite_id) AS edges,
       ARRAY(SELECT e.to_state::text FROM queueworker.task_events e WHERE e.task_id = t.id ORDER BY e.id) AS events
FROM queueworker.tasks t WHERE t.id = ANY(%(ids)s) ORDER BY t.id
"""


def _non_printable_ranges() -> list[tuple[int, int]]:
    """The code points str.isprintable() refuses, as ranges (Postgres text holds neither NUL nor
    surrogates, so neither is listed)."""
    ranges: list[tuple[int, int]] = []
    for point in range(1, 0x110000):
        if 0xD800 <= point <= 0xDFFF or chr(point).isprintable():
            continue
        if ranges and ranges[-1][1] == point - 1 and not 0xD800 <= point - 1 <= 0xDFFF:
            ranges[-1] = (ranges[-1][0], point)
        else:
            ranges.append((point, point))
    return ranges


def test_printable_text_is_str_isprintable_on_every_code_point(dsn):
    refused = query(dsn, """
        SELECT min(p), max(p) FROM (
            SELECT p, p - row_number() OVER (ORDER BY p) AS island
            FROM generate_series(1, 1114111) AS p
            WHERE p NOT BETWEEN 55296 AND 57343 AND NOT queueworker.printable_text(chr(p))) AS points
        GROUP BY island ORDER BY 1""")
    expected = _non_printable_ranges()
    assert [tuple(row) for row in refused] == expected, (
        f"queueworker.printable_text disagrees with str.isprintable() of Unicode {unicodedata.unidata_version}: "
        f"regenerate its class from these ranges: {[(hex(a), hex(b)) for a, b in set(expected) ^ set(refused)][:20]}")


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_the_payload_limits_are_those_a_worker_can_read(dsn):
    """Nesting: 900 levels pass both ways; past that SQL refuses where TaskSpec's own limit is
    Python's recursion limit (about 1,000 levels, less its caller's stack). Integers: up to 4,300
    digits, as TaskSpec."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        TaskSpec(task="t", payload=_nested(900))
        assert conn.execute("SELECT queueworker.enqueue('t', %s)", (json.dumps(_nested(900)),)).fetchone()[0] > 0
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="nested more than 900 levels deep"):
            conn.execute("SELECT queueworker.enqueue('t', %s)", (json.dumps(_nested(901)),))
        TaskSpec(task="t", payload={"n": 10**4299})
        assert conn.execute("SELECT queueworker.enqueue('t', %s)", (f'{{"n": {"9" * 4300}}}',)).fetchone()[0] > 0
        with pytest.raises(ValidationError, match="4,300 digits"):
            TaskSpec(task="t", payload={"n": 10**4300})
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="integer of more than 4,300 digits"):
            conn.execute("SELECT queueworker.enqueue('t', %s)", (f'{{"n": [-{"9" * 4301}]}}',))
        assert conn.execute("SELECT queueworker.enqueue('t', %s)", (f'[{"9" * 4301}.5]',)).fetchone()[0] > 0


# Values of each field's type, weighted to its bounds; values SQL cannot even carry (NUL, lone
# surrogates) are refused on both sides too.
_ODD = ["", " ", "  ", "a b", " a", "\u00a0", "\u200b", "é", "\U0001f600", "x\u2028", "tab\t", "\x7f", "\x85",
        "\U000e0001", "\ue000", "\U0010ffff", "\U000e01ef", "\U000e01f0", "a\x00", "\ud800", "\u0378"]
_TEXT = st.text(max_size=12) | st.sampled_from(_ODD)


def _headers_of_length(length: int, filler: str) -> dict[str, str]:
    """Headers whose JSON, as Python writes it, takes `length` characters: eight of 1,000 characters
    (8,080 with the braces), and one more of `filler`s and x's."""
    headers = {f"h{n}": "x" * 1000 for n in range(8)}
    rest = length - 8080 - 10  # `, "h8": ""`
    unit = len(json.dumps(filler)) - 2
    headers["h8"] = filler * (rest // unit) + "x" * (rest % unit)
    assert len(json.dumps(headers)) == length
    return headers


# Each field's values at and beyond its bounds (and the odd ones): each is checked alone below, and
# drawn among others by the property test.
_BOUNDS: dict[str, list] = {
    "task": ["t" * 200, "t" * 201, "send_email", *_ODD],
    "payload": [None, {"n": 10**4299}, [math.nan], {"a\x00": 1}, ["\ud800"], _nested(900), -0.0, 1e308, "é"],
    "queue": ["default", "q" * 128, "q" * 129, "-q", "a/b", "a\n", "billing.eu", "a..b", "é", None],
    "priority": [-(2**31), INT4_MAX, -(2**31) - 1, INT4_MAX + 1, 2**63, -(2**64), None],
    "run_after": [EARLIEST_RUN_AFTER, LATEST_RUN_AFTER, EARLIEST_RUN_AFTER - timedelta(microseconds=1),
                  LATEST_RUN_AFTER + timedelta(microseconds=1), datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
                  datetime(9999, 12, 31, tzinfo=timezone(timedelta(hours=-5))), None],
    "delay": [0.0, -0.0, -1e-9, math.nan, math.inf, -math.inf, float(INT4_MAX), INT4_MAX + 0.5, 5e-324, 1, None],
    "max_attempts": [1, 1000, 1001, 0, None],
    "timeout_seconds": [1, INT4_MAX, INT4_MAX + 1, 0, None],
    "dedupe_key": ["k" * 512, "k" * 513, *_ODD],
    "dedupe": ["spec", "SPEC", "", "hash"],
    "on_conflict": ["ignore", "replace", "Replace", "", None],
    "key": ["k" * 256, "k" * 257, *_ODD],
    "depends_on": [[1, 2, 3], [0], [-1], [10**12], [2**63 - 1], [2**63], [1, 1], None,
                   list(range(10**12, 10**12 + 1000)), list(range(10**12, 10**12 + 1001))],
    "on_dependency_failure": ["cancel", "run", "Run", None],
    "headers": [{"h": "v" * 1024}, {"h": "v" * 1025}, {f"h{n}": "" for n in range(32)},
                {f"h{n}": "" for n in range(33)}, {"q" * 128: ""}, {"q" * 129: ""}, {"h": 1}, {"h": None}, {},
                *({name: "v"} for name in _ODD), *({"h": value} for value in _ODD),
                *(_headers_of_length(length, filler) for length in (8192, 8193)
                  for filler in ("x", "é", "\U0001f600", '"', "\\"))],
    "notify_on_finish": [True, False, None],
}
_FIELDS: dict[str, st.SearchStrategy] = {
    "payload": st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | _TEXT,
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                            max_leaves=6),
    "queue": st.from_regex(QUEUE_PATTERN, fullmatch=True) | _TEXT,
    "priority": st.integers(-(2**31) - 1, 2**31),
    "run_after": st.datetimes(timezones=st.just(timezone.utc) | st.timezones()),
    "delay": st.floats(-1.0, 2.0**31) | st.integers(-1, 2**31),
    "max_attempts": st.integers(-1, 1002),
    "timeout_seconds": st.integers(-1, 2**31),
    "dedupe_key": _TEXT,
    "dedupe": st.none(),
    "on_conflict": st.nothing(),
    "key": _TEXT,
    "depends_on": st.lists(st.sampled_from([1, 2, 3, 0, -1, 10**12, 2**63 - 1, 2**63]), max_size=3),
    "on_dependency_failure": st.nothing(),
    "headers": st.dictionaries(_TEXT, _TEXT | st.integers(), max_size=3),
    "notify_on_finish": st.booleans(),
}
_FIELDS = {name: strategy | st.sampled_from(_BOUNDS[name]) for name, strategy in _FIELDS.items()}
# Values TaskSpec takes, so that many specs are stored (combinations can still be refused).
_PRINTABLE = st.text(st.characters(whitelist_categories=("L", "M", "N", "P", "S")), min_size=1, max_size=12)
_VALID: dict[str, st.SearchStrategy] = {
    "payload": st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                            | st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_PRINTABLE, inner, max_size=3),
                            max_leaves=6),
    "queue": st.from_regex(QUEUE_PATTERN, fullmatch=True),
    "priority": st.integers(-(2**31), INT4_MAX),
    "run_after": st.datetimes(datetime(2, 1, 2), datetime(9999, 12, 29), timezones=st.just(timezone.utc) | st.timezones()),
    "delay": st.floats(0, 1e6),
    "max_attempts": st.integers(1, 1000),
    "timeout_seconds": st.none() | st.integers(1, INT4_MAX),
    "dedupe_key": st.none() | _PRINTABLE,
    "dedupe": st.none() | st.just("spec"),
    "key": st.none() | _PRINTABLE,
    "depends_on": st.lists(st.sampled_from([1, 2, 3]), unique=True, max_size=3),
    "on_dependency_failure": st.sampled_from(["cancel", "run"]),
    "headers": st.none() | st.dictionaries(_PRINTABLE, _PRINTABLE | st.just(""), max_size=3),
    "notify_on_finish": st.booleans(),
}
_TASKS = _TEXT | st.sampled_from(_BOUNDS["task"])
_VALID_SPECS = st.fixed_dictionaries({"task": _PRINTABLE}, optional=_VALID)
# Specs TaskSpec takes; the same with one field drawn from all its values, so that each field's
# bounds decide alone; and specs of any values at all.
SPECS = (_VALID_SPECS
         | st.tuples(_VALID_SPECS, st.sampled_from(sorted({"task", *_FIELDS})).flatmap(
             lambda name: st.tuples(st.just(name), _TASKS if name == "task" else _FIELDS[name])))
         .map(lambda drawn: {**drawn[0], drawn[1][0]: drawn[1][1]})
         | st.fixed_dictionaries({"task": _TASKS}, optional=_FIELDS))


def _python_outcome(conn: psycopg.Connection, values: dict) -> tuple[str, Any]:
    """What TaskSpec and the Python producer make of `values`: the row stored, or the refusal."""
    try:
        spec = TaskSpec(**values)
    except (ValidationError, ValueError):
        return "refused", "invalid value"
    return _stored(conn, values, lambda: enqueue_many(conn, [spec]))


def _sql_outcome(conn: psycopg.Connection, values: dict) -> tuple[str, Any]:
    """What queueworker.enqueue makes of the same values, each passed as its named argument."""
    arguments = ", ".join(f"{name} => %({name})s::{SQL_TYPES[name]}" for name in values)
    # A payload of None is JSON null (as TaskSpec stores it); headers of None are SQL NULL, none.
    params = {name: Jsonb(value) if name == "payload" or (name == "headers" and value is not None) else value
              for name, value in values.items()}
    return _stored(conn, values, lambda: [conn.execute(f"SELECT queueworker.enqueue({arguments})",
                                                       params).fetchone()[0]])


def _sql_many_outcome(conn: psycopg.Connection, values: dict) -> tuple[str, Any]:
    """What queueworker.enqueue_many makes of them as a JSON object (a time as ISO 8601 text)."""
    spec = {name: value.isoformat() if isinstance(value, datetime) else value for name, value in values.items()}
    return _stored(conn, values, lambda: conn.execute("SELECT queueworker.enqueue_many(%s::jsonb)",
                                                      (json.dumps([spec]),)).fetchone()[0])


def _stored(conn: psycopg.Connection, values: dict, run) -> tuple[str, Any]:
    """Runs an enqueue in a transaction that is rolled back (each side sees the same database), and
    returns its row, or how it was refused."""
    try:
        with conn.transaction(force_rollback=True):
            ids = run()
            delayed = bool(values.get("delay")) and not math.isnan(values["delay"])
            return "stored", conn.execute(ROW, {"ids": ids, "explicit": values.get("run_after") is not None,
                                                "delayed": delayed}).fetchall()
    except psycopg.Error as exc:
        if exc.sqlstate in REFUSED_VALUE or exc.sqlstate is None:  # None: a value the client cannot send
            return "refused", "invalid value"
        return "refused", exc.sqlstate
    except (ValueError, UnicodeEncodeError):  # text with NUL or a lone surrogate, JSON with a 4,301-digit number
        return "refused", "invalid value"


# The rules that join two fields, each side of them.
_COMBINATIONS = [{"run_after": EARLIEST_RUN_AFTER, "delay": 0}, {"run_after": None, "delay": 1},
                 {"dedupe_key": "k", "dedupe": "spec"}, {"dedupe_key": "k", "on_conflict": "replace"},
                 {"dedupe": "spec", "on_conflict": "replace"}, {"dedupe_key": None, "on_conflict": "replace"},
                 {"depends_on": [1, 2], "on_dependency_failure": "run", "notify_on_finish": True}]


def _alike(conn: psycopg.Connection, values: dict) -> str:
    """Asserts that TaskSpec with the Python producer, queueworker.enqueue and
    queueworker.enqueue_many accept and refuse `values` alike, storing the same row; which it was."""
    python = _python_outcome(conn, values)
    assert _sql_outcome(conn, values) == python, values
    assert _sql_many_outcome(conn, values) == python, values
    return python[0]


def test_each_bound_of_each_field_is_held_alike(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert enqueue_many(conn, [{"task": "prerequisite"}] * 3) == [1, 2, 3]
    with psycopg.connect(dsn) as conn:
        outcomes = [_alike(conn, {"task": "t", name: value}) for name, values in _BOUNDS.items() for value in values]
        outcomes += [_alike(conn, {"task": "t", **values}) for values in _COMBINATIONS]
    assert outcomes.count("stored") > 60 and outcomes.count("refused") > 60, outcomes


def test_sql_enqueue_accepts_and_refuses_as_taskspec_does_and_stores_the_same_rows(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert enqueue_many(conn, [{"task": "prerequisite"}] * 3) == [1, 2, 3]
    seen: dict[str, int] = {}
    with psycopg.connect(dsn) as conn:

        @settings(max_examples=600, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(values=SPECS)
        def alike(values):
            outcome = _alike(conn, values)
            seen[outcome] = seen.get(outcome, 0) + 1

        alike()
    assert seen["stored"] > 100 and seen["refused"] > 100, seen


def _notices(conn: psycopg.Connection) -> list[str]:
    """The `queueworker` notifications `conn` (listening, autocommit) has received so far."""
    select.select([conn.fileno()], [], [], 0)
    return sorted(notice.payload for notice in conn.notifies(timeout=0.5, stop_after=100))


def test_unique_tasks_dependencies_and_notifications_work_through_sql_as_through_python(dsn):
    """The same story told by the Python producer and by SQL, each in a transaction rolled back
    afterwards: the rows (ids as positions), their edges, audit rows and wake-ups are the same."""
    def python(conn: psycopg.Connection) -> list[int]:
        first = enqueue(conn, "u", {"v": 1}, dedupe_key="k", delay=3600)
        ids = [first, enqueue(conn, "u", {"v": 2}, dedupe_key="k", on_conflict="replace", priority=7),
               enqueue(conn, "u", {"v": 3}, dedupe_key="k"),
               enqueue(conn, "s", {"x": 1}, queue="later", dedupe="spec", delay=600),
               enqueue(conn, "s", {"x": 1}, queue="later", dedupe="spec")]
        ids.append(enqueue(conn, "d", depends_on=[ids[0], ids[3]], on_dependency_failure="run",
                           notify_on_finish=True, key="tenant", headers={"h": "v"}))
        return ids + enqueue_many(conn, [{"task": "m"}, {"task": "u", "dedupe_key": "k", "notify_on_finish": True},
                                         {"task": "m2", "depends_on": [ids[5]], "queue": "later"}])

    def sql(conn: psycopg.Connection) -> list[int]:
        def one(statement: str, *params: Any) -> int:
            return conn.execute(f"SELECT queueworker.enqueue({statement})", params).fetchone()[0]
        first = one("""'u', '{"v": 1}', dedupe_key => 'k', delay => 3600""")
        ids = [first, one("""'u', '{"v": 2}', dedupe_key => 'k', on_conflict => 'replace', priority => 7"""),
               one("""'u', '{"v": 3}', dedupe_key => 'k'"""),
               one("""'s', '{"x": 1}', queue => 'later', dedupe => 'spec', delay => 600"""),
               one("""'s', '{"x": 1}', queue => 'later', dedupe => 'spec'""")]
        ids.append(one("""'d', depends_on => ARRAY[%s, %s]::bigint[], on_dependency_failure => 'run',
                          notify_on_finish => true, key => 'tenant', headers => '{"h": "v"}'""", ids[0], ids[3]))
        return ids + conn.execute("SELECT queueworker.enqueue_many(%s::jsonb)", (json.dumps([
            {"task": "m"}, {"task": "u", "dedupe_key": "k", "notify_on_finish": True},
            {"task": "m2", "depends_on": [ids[5]], "queue": "later"}]),)).fetchone()[0]

    def told(story) -> tuple[list, list, list[str]]:
        with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn, autocommit=True) as conn:
            listener.execute("LISTEN queueworker")
            with conn.transaction():
                ids = story(conn)
                positions = {task_id: n for n, task_id in enumerate(dict.fromkeys(ids))}
                rows = conn.execute(ROW.replace("t.created_at = t.updated_at", "t.id"),
                                    {"ids": ids, "explicit": False, "delayed": True}).fetchall()
                conn.execute("DELETE FROM queueworker.task_dependencies")
                conn.execute("DELETE FROM queueworker.tasks")
            # The due times the later queue announced are the producer's: only the shape is compared.
            notices = [notice.split(" ")[0] + (" <due>" if " " in notice else "") for notice in _notices(listener)]
        normalised = [(*row[:13], positions[row[13]], *row[14:16],
                       [f"{positions[int(edge.split(':')[0])]}:{edge.split(':')[1]}" for edge in row[16]], row[17])
                      for row in rows]
        return [positions[i] for i in ids], normalised, notices

    by_python, by_sql = told(python), told(sql)
    assert by_sql == by_python
    ids, rows, notices = by_sql
    assert ids == [0, 0, 0, 1, 1, 2, 3, 0, 4]
    assert [(row[7], row[3], row[10]) for row in rows[:1]] == [({"v": 2}, 7, True)], "replaced, then marked"
    # One per queue and due time (Postgres sends a transaction's equal notifications once): the first
    # task due in an hour, the replacement due now, the later queue's spec task due in ten minutes.
    assert notices == ["default", "default <due>", "later <due>"]


def test_sql_delays_count_from_the_transaction_start(dsn):
    with psycopg.connect(dsn) as conn:
        ids = [conn.execute("SELECT queueworker.enqueue('t', delay => 90.5)").fetchone()[0],
               *conn.execute("""SELECT queueworker.enqueue_many('[{"task": "t", "delay": 2147483647}]')""").fetchone()[0]]
        assert conn.execute("SELECT array_agg(extract(epoch FROM run_after - now()) ORDER BY id), bool_and(delayed) "
                            "FROM queueworker.tasks WHERE id = ANY(%s)", (ids,)).fetchone() == ([90.5, 2147483647], True)


@pytest.mark.parametrize("call, message", [
    ("SELECT queueworker.enqueue('t', priority => 2147483648)", "priority must be an integer from -2147483648"),
    ("SELECT queueworker.enqueue('t', run_after => now(), delay => 1)", "give run_after or delay, not both"),
    ("SELECT queueworker.enqueue(E'a\\nb')", "task must be printable text of 1 to 200 characters"),
    ("SELECT queueworker.enqueue('t', depends_on => ARRAY[1, 1])", "depends_on lists a task twice"),
    ("""SELECT queueworker.enqueue_many('[{"task": "t"}, {"task": "t", "queue": "a b"}]')""",
     "enqueue_many: spec 2: queue must be letters, digits and _.:-"),
    ("""SELECT queueworker.enqueue_many('[{"task": "t", "prio": 1}]')""", "enqueue_many: spec 1: no field 'prio'"),
    ("""SELECT queueworker.enqueue_many('[{"task": "t", "run_after": "2026-11-27 10:00"}]')""",
     "spec 1: run_after must be a time with its offset"),
    ("""SELECT queueworker.enqueue_many('[{"task": "t", "max_attempts": 2.5}]')""",
     "spec 1: max_attempts must be a JSON integer"),
    ("""SELECT queueworker.enqueue_many('{"task": "t"}')""", "specs must be a JSON array of objects"),
])
def test_each_refusal_is_one_line_with_a_code_a_client_recognises_and_leaves_nothing(dsn, call, message):
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            conn.execute(call)
    assert message in refused.value.diag.message_primary and "\n" not in refused.value.diag.message_primary
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 0


def test_producer_logins_use_only_their_granted_queues_and_read_only_their_tasks(installation):
    installation.install()
    with tenants(installation, "billing", "shipping") as logins:
        with psycopg.connect(logins["shipping"], autocommit=True) as conn:
            theirs = conn.execute("SELECT queueworker.enqueue('qw.noop', queue => 'shipping.labels', "
                                  "dedupe_key => 'label-1', delay => 3600)").fetchone()[0]
            # Before the first grant a producer reads back any task, as it may use any queue.
            assert conn.execute("SELECT state FROM queueworker.task_status(%s)", (theirs,)).fetchall() == [("pending",)]
        as_operator(installation, "grant", user(logins["billing"]), "--queue", "billing.*")
        as_operator(installation, "grant", user(logins["shipping"]), "--queue", "shipping.*")
        with psycopg.connect(logins["billing"], autocommit=True) as conn:
            mine = conn.execute("SELECT queueworker.enqueue('qw.noop', queue => 'billing.eu')").fetchone()[0]
            mine_too = conn.execute("""SELECT queueworker.enqueue_many('[{"task": "qw.noop", "queue": "billing.eu",
                                       "dedupe_key": "b-1", "depends_on": [%s]}]')""" % mine).fetchone()[0]
            for attempt in ("SELECT queueworker.enqueue('qw.noop', queue => 'shipping.labels')",
                            "SELECT queueworker.enqueue('qw.noop', queue => 'shipping.labels', dedupe_key => 'label-1', "
                            "on_conflict => 'replace')",
                            """SELECT queueworker.enqueue_many('[{"task": "qw.noop", "queue": "billing.eu"},
                                                                {"task": "qw.noop", "queue": "shipping.labels"}]')"""):
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                    conn.execute(attempt)
                assert refused.value.diag.message_primary == f"login {user(logins['billing'])} may not use queue " \
                                                             "shipping.labels"
            with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"there is no task {theirs} to depend on"):
                conn.execute("SELECT queueworker.enqueue('qw.noop', queue => 'billing.eu', depends_on => ARRAY[%s])",
                             (theirs,))
            # Another tenant's task does not exist to this login; its own it reads.
            assert conn.execute("SELECT * FROM queueworker.task_status(%s)", (theirs,)).fetchall() == []
            assert conn.execute("SELECT queue, state, attempts, result, error FROM queueworker.task_status(%s)",
                                (mine,)).fetchall() == [("billing.eu", "pending", 0, None, None)]
            assert conn.execute("SELECT state FROM queueworker.task_status(%s)", (mine_too[0],)).fetchall() == [
                ("blocked",)]
    assert query(installation.admin, "SELECT id, payload, priority FROM queueworker.tasks WHERE queue = 'shipping.labels'"
                 ) == [(theirs, {}, 0)], "theirs untouched, and nothing enqueued into their queue"
    assert scalar(installation.admin, "SELECT count(*) FROM queueworker.tasks") == 3


def test_a_listening_worker_runs_an_sql_enqueued_task_without_polling(installation):
    """The worker polls every ten minutes at most: only the enqueue's NOTIFY can have it claim in time."""
    installation.install()
    worker = WorkerProcess(installation.logins["worker"], "--queue", "sql", "--poll-min-seconds", "600",
                           "--poll-max-seconds", "600", "--scheduler-max-interval-seconds", "600", *FAST_LEASES)
    try:
        with psycopg.connect(installation.logins["producer"], autocommit=True) as conn:
            def run(statement: str) -> None:
                task_id = conn.execute(statement).fetchone()[0]
                wait_until(lambda: conn.execute("SELECT state FROM queueworker.task_status(%s)",
                                                (task_id,)).fetchone()[0] == "succeeded",
                           timeout=60, message=f"task {task_id} to succeed")
            run("SELECT queueworker.enqueue('qw.noop', queue => 'sql')")  # the worker is up, listening and idle
            run("SELECT queueworker.enqueue('qw.noop', queue => 'sql')")
            run("""SELECT (queueworker.enqueue_many('[{"task": "qw.noop", "queue": "sql"}]'))[1]""")
    finally:
        worker.stop()
    assert "permission denied" not in worker.log(), worker.log()


@pytest.mark.parametrize("run_example", [run_node_example, run_go_example], ids=["node", "go"])
def test_the_examples_enqueue_tasks_a_worker_runs_and_read_their_results(installation, run_example):
    installation.install()
    worker = WorkerProcess(installation.logins["worker"], "--queue", "emails", "--handlers", "tests.producer_handlers",
                           *FAST_LEASES)
    try:
        done = run_example(installation.logins["producer"], "--wait" if run_example is run_node_example else "-wait")
    finally:
        worker.stop()
    assert done.returncode == 0, done.stderr + worker.log()[-3000:]
    lines = done.stdout.splitlines()
    ids = [int(word) for word in lines[0].removeprefix("enqueued ").split()]
    finished = [(int(task_id), state, json.loads(result))
                for task_id, state, result in (line.split(" ", 2) for line in lines[1:])]
    assert len(ids) == 3 and finished == [(task_id, "succeeded", {"sent_to": user_id})
                                          for task_id, user_id in zip(ids, (42, 43, 44))]
    assert query(installation.admin, "SELECT id, task, key, dedupe_key, priority, max_attempts FROM queueworker.tasks "
                                     "ORDER BY id") == [
        (ids[0], "emails.send_welcome", "tenant-7", "welcome-42", 5, 10),
        (ids[1], "emails.send_welcome", None, None, 0, 10), (ids[2], "emails.send_welcome", None, None, 0, 3)]
    # A refusal reaches the program as one line with its SQLSTATE.
    with psycopg.connect(installation.admin, autocommit=True) as conn:
        conn.execute("SELECT queueworker.grant_queue('queueworker_operator', 'other')")
    refused = run_example(installation.logins["producer"])
    # (`go run` adds its own line, "exit status 1".)
    assert refused.returncode == 1 and refused.stderr.splitlines()[0] == (
        f"enqueue failed: login {user(installation.logins['producer'])} may not use queue emails (SQLSTATE 42501)"), \
        refused.stderr


def test_a_unique_spec_whose_holder_went_in_between_is_enqueued_again(dsn):
    """The holder of a key finished and was cleaned up between the insert that found the key held
    and the lookup of its holder (staged here by a lookup that deletes it first, as retention could):
    the spec is inserted again, with its edges, as the Python producer's plan does."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        prerequisite, holder = enqueue(conn, "p"), enqueue(conn, "u", dedupe_key="k")
        conn.execute("""
            ALTER FUNCTION queueworker.existing_tasks(bigint[], text[], text[]) RENAME TO existing_tasks_as_shipped;
            CREATE FUNCTION queueworker.existing_tasks(ords bigint[], queues text[], dedupe_keys text[])
            RETURNS TABLE (ord bigint, id bigint, state text) LANGUAGE sql AS $$
                WITH gone AS (DELETE FROM queueworker.tasks WHERE dedupe_key = 'k' RETURNING id)
                SELECT NULL::bigint, NULL::bigint, NULL::text FROM gone WHERE false
            $$""")
        ids = conn.execute("""SELECT queueworker.enqueue_many(%s::jsonb)""", (json.dumps([
            {"task": "plain"}, {"task": "u", "dedupe_key": "k", "depends_on": [prerequisite]}]),)).fetchone()[0]
    assert holder not in ids and len(set(ids)) == 2
    assert query(dsn, "SELECT t.task, t.state::text, d.prerequisite_id FROM queueworker.tasks t "
                      "LEFT JOIN queueworker.task_dependencies d ON d.task_id = t.id WHERE t.id = ANY(%s) ORDER BY t.id",
                 (ids,)) == [("plain", "pending", None), ("u", "blocked", prerequisite)]


def _enqueue_many_counting_checks(conn: psycopg.Connection, specs: list[dict]) -> tuple[list[int], int]:
    """queueworker.enqueue_many's ids for `specs`, and how many calls of the spec-by-spec checks
    (spec_field, task_spec_problem) it made: this transaction's own function statistics."""
    conn.execute("SET LOCAL track_functions = 'all'")
    ids = conn.execute("SELECT queueworker.enqueue_many(%s::jsonb)", (json.dumps(specs),)).fetchone()[0]
    calls = conn.execute("""SELECT coalesce(sum(calls), 0)::int FROM pg_stat_xact_user_functions
                            WHERE schemaname = 'queueworker' AND funcname IN ('spec_field', 'task_spec_problem')""")
    return ids, calls.fetchone()[0]


def test_a_batch_of_plain_specs_is_checked_in_one_statement_and_stores_what_the_loop_stores(dsn):
    """A batch of plain specs (every field but run_after, depends_on and headers) is checked and read
    in one statement, without a call per spec; one spec the statement does not take (headers here)
    sends the whole batch through the spec-by-spec loop. Both store the same rows, and a refusal deep
    in a large batch names its spec."""
    specs = [{"task": f"t{n % 7}", "payload": {"n": n, "s": "é" * (n % 3)}, "queue": f"q{n % 3}", "priority": n % 5 - 2,
              "delay": [0, 0.0, None, 5][n % 4], "max_attempts": 1 + n % 1000, "timeout_seconds": [None, 1, INT4_MAX][n % 3],
              "dedupe_key": f"d{n}" if n % 2 else None, "dedupe": "spec" if n % 4 == 2 else None,
              "on_conflict": "replace" if n % 4 == 1 else "ignore", "key": f"k{n % 11}" if n % 3 else None,
              "depends_on": [], "on_dependency_failure": ["cancel", "run"][n % 2], "headers": None,
              "notify_on_finish": n % 5 == 0} for n in range(3000)]
    with psycopg.connect(dsn) as conn:
        with conn.transaction(force_rollback=True):
            ids, calls = _enqueue_many_counting_checks(conn, specs)
            plain = conn.execute(ROW, {"ids": ids, "explicit": False, "delayed": False}).fetchall()
        assert calls == 0 and len(ids) == len(specs)
        with conn.transaction(force_rollback=True):
            ids, calls = _enqueue_many_counting_checks(conn, [*specs, {"task": "last", "headers": {"h": "v"}}])
            looped = conn.execute(ROW, {"ids": ids[:-1], "explicit": False, "delayed": False}).fetchall()
        assert calls > len(specs) and looped == plain
        with conn.transaction(force_rollback=True):
            wrong = [*specs[:2344], {**specs[2344], "max_attempts": 1001}, *specs[2345:]]
            with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
                conn.execute("SELECT queueworker.enqueue_many(%s::jsonb)", (json.dumps(wrong),))
        assert refused.value.diag.message_primary == (
            "queueworker.enqueue_many: spec 2345: max_attempts must be an integer from 1 to 1000")

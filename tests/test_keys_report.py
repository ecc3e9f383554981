"""`queueworker keys Q` and queueworker.client.keys.key_report: the keys of a queue, the busiest first,
with the totals over every key however few are listed."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from queueworker import enqueue_many
from queueworker.client import keys, operations
from queueworker.client.producer import TaskSpec
from tests.test_cli import _one_clear_line, qw, qw_here
from tests.test_fair_share import claim
from tests.test_roles import installation  # noqa: F401 (a fixture: a login per role of docs/database-roles.sql)

pytestmark = pytest.mark.integration


def fill(conn: psycopg.Connection) -> None:
    """In queue "q": key "big" 5 ready and 1 running, "small" 2 ready, "later" 1 delayed, 3 tasks
    without a key; "idle" has a weight and no task; another queue has a key of its own."""
    future = datetime.now(timezone.utc) + timedelta(hours=1)
    enqueue_many(conn, [TaskSpec(task="t", queue="q", key="big")] * 6 + [TaskSpec(task="t", queue="q", key="small")] * 2
                 + [TaskSpec(task="t", queue="q")] * 3 + [TaskSpec(task="t", queue="q", key="later", run_after=future)]
                 + [TaskSpec(task="t", queue="elsewhere", key="other")])
    operations.set_limits(conn, "q", key="idle", weight=2.5)
    claimed = claim(conn, "q", limit=1)  # the fair claim takes the first key in line: "big"
    assert len(claimed) == 1


def test_each_key_is_counted_the_busiest_first_and_the_totals_count_every_key(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        fill(conn)
        report = keys.key_report(conn, "q")
        short = keys.key_report(conn, "q", limit=2)
    rows = {row["key"]: (row["ready"], row["later"], row["blocked"], row["running"], row["weight"])
            for row in report["keys"]}
    assert rows == {"big": (5, 0, 0, 1, None), None: (3, 0, 0, 0, None), "small": (2, 0, 0, 0, None),
                    "later": (0, 1, 0, 0, None), "idle": (0, 0, 0, 0, 2.5)}
    assert [row["key"] for row in report["keys"]][:3] == ["big", None, "small"]
    assert (report["keys_total"], report["ready_total"], report["running_total"]) == (5, 10, 1)
    assert report["keys"][0]["oldest_ready_seconds"] >= 0 and report["keys"][3]["oldest_ready_seconds"] is None
    assert [row["key"] for row in short["keys"]] == ["big", None]
    assert (short["keys_total"], short["ready_total"]) == (5, 10), "the totals are not cut with the list"


def test_the_command_prints_a_table_or_json_and_escapes_what_a_terminal_would_obey(dsn, monkeypatch):
    with psycopg.connect(dsn, autocommit=True) as conn:
        fill(conn)
        conn.execute("INSERT INTO queueworker.tasks (queue, task, key, delayed) VALUES ('q', 't', 'a\u200bb', false)")
    result = qw_here(monkeypatch, "keys", "q", "--limit", "3", "--dsn", dsn)
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()
    assert lines[0] == "queue q: 6 keys, 11 tasks ready, 1 running (the 3 with the most ready below)"
    assert lines[1].split() == ["KEY", "READY", "LATER", "BLOCKED", "RUNNING", "OLDEST", "WEIGHT", "LIMITS"]
    assert lines[2].split()[:5] == ["big", "5", "0", "0", "1"] and lines[3].split()[:2] == ["(no", "key)"]
    assert len(lines) == 5 and all(len(line) <= 80 for line in lines)
    everything = qw_here(monkeypatch, "keys", "q", "--limit", "10", "--dsn", dsn).stdout
    assert "a\\u200bb" in everything and "\u200b" not in everything
    report = json.loads(qw_here(monkeypatch, "keys", "q", "--json", "--dsn", dsn).stdout)
    assert {row["key"] for row in report["keys"]} == {"big", None, "small", "later", "idle", "a\u200bb"}
    empty = qw_here(monkeypatch, "keys", "nothing-here", "--dsn", dsn)
    assert empty.stdout.strip() == "queue nothing-here: 0 keys, 0 tasks ready, 0 running"


@pytest.mark.parametrize("args, fragment", [
    (["keys", "q", "--limit", "0"], "--limit"),
    (["keys", "q", "--limit", "10001"], "--limit"),
    (["keys", "q", "--limit", "nan"], "--limit"),
    (["keys", "not a queue"], "queue"),
    (["keys", "q\x1b[2J"], "queue"),
])
def test_bad_input_is_one_line_from_a_real_process(dsn, args, fragment):
    result = qw(*args, "--dsn", dsn)
    _one_clear_line(result, 2, fragment)


def test_bad_limits_are_refused_by_the_api_too(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        for limit in (0, -1, 10_001, True, 2.5, "5"):
            with pytest.raises(ValueError, match="the limit is 1 to 10,000 keys"):
                keys.key_report(conn, "q", limit)


def test_an_operator_reads_the_keys_and_a_producer_may_not(installation):
    installation.install()
    with psycopg.connect(installation.logins["producer"], autocommit=True) as conn:
        enqueue_many(conn, [TaskSpec(task="t", queue="q", key="k")] * 2)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            keys.key_report(conn, "q")
    with psycopg.connect(installation.logins["operator"], autocommit=True) as conn:
        assert keys.key_report(conn, "q")["keys"][0]["ready"] == 2


def test_the_console_lists_the_keys_of_a_queue_escaped(dsn):
    from tests.test_console import client  # the console's extra: imported where it is used

    with psycopg.connect(dsn, autocommit=True) as conn:
        fill(conn)
        enqueue_many(conn, [TaskSpec(task="t", queue="q", key="<script>alert(1)</script>")])
    with client(dsn) as c:
        assert 'href="/keys?queue=q"' in c.get("/queues").text
        page = c.get("/keys?queue=q")
        assert page.status_code == 200
        assert "6 keys, 11 tasks ready, 1 running." in page.text
        rows = re.findall(r"<tr><td>(.*?)</td>\s*<td class=\"n\">(\d+)</td>", page.text)
        assert rows[:3] == [("big", "5"), ('<span class="muted">(no key)</span>', "3"), ("small", "2")]
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text and "<script>alert" not in page.text
        assert "Give a queue" in c.get("/keys").text
        with psycopg.connect(dsn, autocommit=True) as conn:
            operations.set_limits(conn, "q", per_key_max_running=2)
        assert "<td>cap 2</td>" in c.get("/keys?queue=q").text
        assert c.get("/keys?queue=not%20a%20queue").status_code == 400


def test_each_key_shows_the_limits_that_hold_for_it_its_pause_and_its_tokens(dsn, monkeypatch):
    with psycopg.connect(dsn, autocommit=True) as conn:
        fill(conn)
        operations.set_limits(conn, "q", per_key_rate_per_second=8, per_key_burst=8, per_key_max_running=2)
        operations.set_limits(conn, "q", key="small", max_running=1, rate_per_second=0.001, burst=3)
        operations.pause(conn, "q", key="later")
        report = {row["key"]: row for row in keys.key_report(conn, "q")["keys"]}
    big, small, later = report["big"], report["small"], report["later"]
    assert (big["max_running"], big["rate_per_second"], big["burst"], big["tokens"], big["paused"]) == \
        (2, 8, 8, 8, False), "the queue's defaults, and a bucket never charged is full"
    assert (small["max_running"], small["rate_per_second"], small["burst"], small["tokens"]) == (1, 0.001, 3, 3)
    assert later["paused"] and later["paused_until"] is None
    assert report[None]["max_running"] == 2, "the tasks without a key are one key under the defaults"
    assert keys.describe_limits(later) == "paused; cap 2; 8/s, 8 of 8 tokens"
    assert keys.describe_limits(small) == "cap 1; 0.001/s, 3 of 3 tokens"
    table = qw_here(monkeypatch, "keys", "q", "--dsn", dsn).stdout
    assert table.splitlines()[1].split()[-1] == "LIMITS" and "cap 1; 0.001/s" in table


def test_a_key_whose_breaker_is_open_is_listed_without_a_task_or_a_setting(dsn, monkeypatch):
    """A source that failed until its breaker opened and has no task left is what an operator
    looks for: it is listed, once, as is the key of the tasks without a key when its breaker opened."""
    from tests.test_key_breaker import report

    with psycopg.connect(dsn, autocommit=True) as conn:
        fill(conn)
        operations.set_breaker(conn, "q", failures=1, cooldown_seconds=600, per_key=True)
        assert report(conn, "q", {"": (False, 1), "gone": (False, 1), "fine": (True, 0)}) == {
            "": "open", "gone": "open", "fine": "closed"}
        listed = {row["key"]: row for row in keys.key_report(conn, "q")["keys"]}
    assert set(listed) == {"big", None, "small", "later", "idle", "gone"}, "a closed breaker alone lists nothing"
    gone = listed["gone"]
    assert (gone["ready"], gone["running"], gone["breaker_state"], gone["failure_streak"]) == (0, 0, "open", 1)
    assert (listed[None]["ready"], listed[None]["breaker_state"]) == (3, "open"), "one row for the tasks without a key"
    assert keys.describe_limits(gone) == "breaker open"
    printed = json.loads(qw_here(monkeypatch, "keys", "q", "--json", "--dsn", dsn).stdout)
    assert {row["key"]: row["breaker_state"] for row in printed["keys"]}["gone"] == "open"

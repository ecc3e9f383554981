"""queueworker.testing, the helpers for an application's own tests: assertions about what is
enqueued, and `drain`, which runs due tasks through a real worker in-process. And its pytest plugin,
tested as a user meets it: the test suite of a small application (examples/tested_app) run by
pytest in a process of its own, on a given server and on a local one the plugin starts itself."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import psycopg
import pytest

from queueworker import Continue, Registry, enqueue, enqueue_many
from queueworker.testing import DrainTimeout, assert_enqueued, drain, enqueued, refute_enqueued
from tests.cluster.kubelet import REPO_ROOT

pytestmark = pytest.mark.integration

TESTED_APP = REPO_ROOT / "examples" / "tested_app"


def test_assertions_match_by_filter_and_payload_containment_and_say_what_is_there(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        refute_enqueued(conn)
        with pytest.raises(AssertionError, match=r"no task waiting to run matches anything; waiting to run: none"):
            assert_enqueued(conn)
        first, _ = enqueue_many(conn, [{"task": "mail.send", "payload": {"to": "ada", "lang": "en"}, "key": "ada"},
                                       {"task": "mail.send", "payload": {"to": "bob"}, "queue": "slow",
                                        "priority": 5}])

        found = assert_enqueued(conn, task="mail.send", payload={"to": "ada"})  # a part of the payload matches
        assert (found["id"], found["payload"], found["key"]) == (first, {"to": "ada", "lang": "en"}, "ada")
        assert_enqueued(conn, queue="slow", priority=5)
        assert [t["payload"] for t in enqueued(conn, task="mail.send")] == [{"to": "ada", "lang": "en"},
                                                                           {"to": "bob"}]
        with pytest.raises(AssertionError) as missing:
            assert_enqueued(conn, task="mail.send", payload={"to": "ada", "lang": "de"})
        assert "matches task='mail.send', payload={'to': 'ada', 'lang': 'de'}" in str(missing.value)
        assert f"#{first} mail.send in default (pending, priority 0 key='ada')" in str(missing.value)
        with pytest.raises(AssertionError, match=r"1 task\(s\) waiting to run match queue='slow':\n  #\d+ mail.send"):
            refute_enqueued(conn, queue="slow")
        refute_enqueued(conn, task="mail.send", key="bob")
        for hostile in ({"n": float("nan")}, {"to": "a\x00b"}):
            with pytest.raises(ValueError, match="payload to match is not JSON a task can hold"):
                assert_enqueued(conn, payload=hostile)


def test_drain_runs_what_is_due_with_what_it_enqueues_and_leaves_later_work_waiting(dsn):
    registry = Registry()
    ran = []

    @registry.task(name="page")
    def page(payload, ctx):
        ran.append(payload["n"])
        return Continue({"n": payload["n"] + 1}) if payload["n"] < 3 else {"last": payload["n"]}

    @registry.task(name="flaky")
    def flaky(payload, ctx):
        raise RuntimeError("down")

    with psycopg.connect(dsn, autocommit=True) as conn:
        assert drain(conn, registry=registry) == [], "nothing due: nothing to run"
        later = enqueue(conn, "page", {"n": 100}, delay=3600)
        enqueue(conn, "page", {"n": 1})
        enqueue(conn, "flaky", queue="other")
        enqueue(conn, "nobody.knows", queue="other")

        done = drain(conn, registry=registry)

        assert ran == [1, 2, 3], "the pages it enqueued ran in the same drain; the delayed task did not"
        by_task = {}
        for task in done:
            by_task.setdefault(task.task, []).append(task)
        assert [(t.state, t.result) for t in by_task["page"]] == [("succeeded", None), ("succeeded", None),
                                                                  ("succeeded", {"last": 3})]
        assert [(t.state, t.attempts) for t in by_task["flaky"]] == [("retrying", 1)], "backing off: not due"
        [unknown] = by_task["nobody.knows"]
        assert (unknown.state, unknown.attempts, unknown.error["type"]) == ("pending", 0, "UnknownTaskError")
        assert_enqueued(conn, task="page", payload={"n": 100})
        assert later not in {t.id for t in done}

        # One queue only.
        enqueue(conn, "page", {"n": 3}, queue="a")
        enqueue(conn, "page", {"n": 3}, queue="b")
        assert [t.queue for t in drain(conn, "a", registry=registry)] == ["a"]
        assert_enqueued(conn, queue="b")


def test_drain_refuses_uncommitted_work_and_gives_up_naming_what_is_left(dsn):
    registry = Registry()

    @registry.task(name="stuck")
    def stuck(payload, ctx):
        ctx.cancelled.wait(60)  # until the worker stops the attempt

    with psycopg.connect(dsn) as conn:
        enqueue(conn, "stuck")
        with pytest.raises(RuntimeError, match="commit the transaction that enqueued them first"):
            drain(conn, registry=registry)
        conn.commit()
        with pytest.raises(DrainTimeout, match=r"drain of default gave up after 1 s with 0 task\(s\) due and 1 "
                                               r"running"):
            drain(conn, registry=registry, timeout=1)
        # The worker stopped the attempt it still ran and handed the task back, no attempt spent.
        assert_enqueued(conn, task="stuck")
        assert conn.execute("SELECT attempts FROM queueworker.tasks WHERE task = 'stuck'").fetchone() == (0,)


def _run_tested_app(tmp_path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The example application's own test suite, copied out of this repository (so that only what
    an installed queueworker offers is at hand), run by pytest in a process of its own."""
    app = tmp_path / "tested_app"
    shutil.copytree(TESTED_APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=app, env=env, capture_output=True, text=True, timeout=300)


def test_an_applications_suite_gets_a_database_per_test_on_the_given_server(postgres, tmp_path):
    _, admin_dsn = postgres
    done = _run_tested_app(tmp_path, {**os.environ, "QUEUEWORKER_TEST_DSN": admin_dsn})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"\b5 passed\b", done.stdout), done.stdout[-2000:]
    # Each test's database, and the template, are gone.
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'queueworker\\_test\\_%'").fetchall()
    assert left == []


def test_an_applications_suite_starts_a_local_server_when_none_is_given(tmp_path):
    env = {name: value for name, value in os.environ.items() if name != "QUEUEWORKER_TEST_DSN"}
    done = _run_tested_app(tmp_path, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"\b5 passed\b", done.stdout), done.stdout[-2000:]

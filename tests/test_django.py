"""queueworker as a backend of Django's tasks framework, with a real Django site (tests/django_site)
and a real `queueworker worker --django` process: on Django 5.2 with the django-tasks backport (this
Python), and on Django 6's own django.tasks (Python 3.12 or later: the interpreter
$QUEUEWORKER_DJANGO6_PYTHON names, which `.ci/run` builds; required in CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cluster.kubelet import REPO_ROOT
from tests.support import query, scalar, wait_until

pytestmark = pytest.mark.integration

DJANGO6_PYTHON = "QUEUEWORKER_DJANGO6_PYTHON"


def _django6_python() -> str:
    python = os.environ.get(DJANGO6_PYTHON)
    if not python:
        message = f"${DJANGO6_PYTHON} names no Python with Django 6 (.ci/run builds one)"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    return python


@pytest.fixture(params=["django-5.2-backport", "django-6"])
def python(request) -> str:
    return sys.executable if request.param == "django-5.2-backport" else _django6_python()


def _site(python: str, dsn: str, *args: str) -> object:
    done = subprocess.run([python, "-m", "tests.django_site.actions", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "QUEUEWORKER_DJANGO_DSN": dsn,
                                                       "DJANGO_SETTINGS_MODULE": "tests.django_site.settings"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_django_tasks_run_on_a_queueworker_worker_and_report_their_results(python, dsn):
    major = subprocess.run([python, "-c", "import django; print(django.VERSION[0])"], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert major == ("5" if python == sys.executable else "6")

    ids = _site(python, dsn, "enqueue")
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks") == 4, "the rolled-back enqueue left nothing"
    assert scalar(dsn, "SELECT round(extract(epoch FROM run_after - created_at) / 60) FROM queueworker.tasks "
                       "WHERE id = %s AND state = 'pending' AND delayed", (int(ids["later"]),)) == 60, "run_after"
    assert query(dsn, "SELECT queue, priority, max_attempts, payload ->> 'task' FROM queueworker.tasks "
                      "WHERE id = %s", (int(ids["explode"]),)) == [("reports", 10, 1, "tests.django_site.tasks.explode")]

    worker = subprocess.Popen([python, "-m", "queueworker.cli", "worker", "--dsn", dsn, "--django",
                               "tests.django_site.settings", "--queue", "default", "--queue", "reports",
                               "--log-format", "text"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "QUEUEWORKER_DJANGO_DSN": dsn})
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks "
                                       "WHERE state IN ('succeeded', 'failed')") == 3, timeout=60,
                   message="the three Django tasks to finish")
    finally:
        worker.terminate()
        log = worker.communicate(timeout=60)[0]
    assert worker.returncode == 0, log[-3000:]

    results = {r["id"]: r for r in _site(python, dsn, "results", ids["add"], ids["explode"], ids["describe"],
                                         ids["rolled_back"])}
    added, exploded, described = results[ids["add"]], results[ids["explode"]], results[ids["describe"]]
    assert (added["status"], added["return_value"], added["args"], added["attempts"]) == ("SUCCESSFUL", 5, [2, 3], 1)
    assert added["task"] == "tests.django_site.tasks.add"
    assert exploded["status"] == "FAILED" and exploded["attempts"] == 1
    [(exception_class, traceback)] = exploded["errors"]
    assert exception_class == "builtins.ValueError" and "ValueError: boom" in traceback
    assert described["status"] == "SUCCESSFUL"
    assert described["return_value"] == {"attempt": 1, "id": ids["describe"], "note": "committed"}
    assert results[ids["rolled_back"]]["status"] == "TaskResultDoesNotExist"


@pytest.mark.parametrize("payload, refusal", [
    ({"task": "os.system", "args": ["touch /tmp/owned"]}, "os.system is not a Django task"),
    ({"task": "no.such.module.fn"}, "no Django task no.such.module.fn"),
    ({"task": "tests.django_site.tasks.add", "args": {"a": 1}}, "are a list and an object"),
    ("not an object", "names the task"),
])
def test_a_worker_calls_only_django_tasks(payload, refusal):
    from queueworker.django.backend import run_django_task
    from queueworker.runtime.handlers import PermanentError

    with pytest.raises(PermanentError, match=refusal):
        run_django_task(payload, None)

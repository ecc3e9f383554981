"""A worker imports only what it needs before its first claim: what it may never use (croniter
without schedules, the controller's scaling policy that the demo uses, TaskSpec's validator)
loads on first use. Each check runs in a fresh interpreter, whose sys.modules says what was loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from queueworker.cli import COMMANDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Top-level packages a worker without schedules does not need before (or after) its first claim.
DEFERRED = ("croniter", "dateutil", "queueworker_controller")
LOADED = f"sorted({{name.split('.')[0] for name in sys.modules}} & {set(DEFERRED)!r})"


def _run(program: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(program), *args], capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_the_cli_and_the_worker_import_without_what_they_may_never_use():
    seen = _run(f"""
        import json, sys
        import queueworker.cli, queueworker.runtime.worker
        from queueworker.client.producer import TaskSpec
        parser = queueworker.cli.build_parser()  # every command's parser, the demo's defaults too
        print(json.dumps({{"loaded": {LOADED}, "task_spec_built": TaskSpec.__pydantic_complete__}}))
    """)
    assert seen == {"loaded": [], "task_spec_built": False}


def test_a_command_loads_the_module_of_no_other_command():
    seen = _run("""
        import json, sys
        import queueworker.cli
        args = queueworker.cli.build_parser("worker").parse_args(["worker", "--queue", "q"])
        print(json.dumps({"queue": args.queues, "loaded": sorted(
            name for name in sys.modules if name.startswith("queueworker.cli."))}))
    """)
    assert seen == {"queue": ["q"], "loaded": ["queueworker.cli.common", "queueworker.cli.worker"]}
    every = _run("""
        import json, sys
        import queueworker.cli
        queueworker.cli.build_parser()
        print(json.dumps(sorted(name for name in sys.modules if name.startswith("queueworker.cli."))))
    """)
    assert every == sorted({f"queueworker.cli.{module}" for _, module, _, _ in COMMANDS} | {"queueworker.cli.common",
                                                                                             "queueworker.cli.tables"})


@pytest.mark.integration
def test_a_worker_without_schedules_runs_tasks_without_croniter_which_loads_for_a_schedule(dsn):
    seen = _run(f"""
        import asyncio, json, sys
        import psycopg
        from queueworker import enqueue
        from queueworker.client.cron import cron_job
        from queueworker.runtime.handlers import Registry
        from queueworker.settings import WorkerSettings
        from queueworker.runtime.worker import Worker
        from tests.support import run_worker_until, scalar
        dsn = sys.argv[1]
        registry = Registry()
        registry.register(lambda payload: payload["n"] + 1, "t.add")
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue(conn, "t.add", {{"n": 1}})
        done = lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 1
        fast = WorkerSettings(lease_seconds=3, heartbeat_seconds=1, drain_seconds=1)
        exit_code = asyncio.run(run_worker_until(Worker(dsn, fast, registry), done))
        after_task = {LOADED}
        job = cron_job("nightly", "30 2 * * *", "t.add", {{"n": 1}}, timezone="Europe/Berlin")
        print(json.dumps({{"exit_code": exit_code, "after_task": after_task, "after_schedule": {LOADED},
                          "result": scalar(dsn, "SELECT result::text FROM queueworker.tasks"),
                          "schedule": [job.name, job.expression]}}))
    """, dsn)
    assert seen == {"exit_code": 0, "after_task": [], "after_schedule": ["croniter", "dateutil"], "result": "2",
                    "schedule": ["nightly", "30 2 * * *"]}

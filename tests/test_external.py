"""The external-process executor, with real child processes (no database needed)."""

import asyncio
import logging
import sys
import time

import pytest

from queueworker.external import CommandFailed, CommandTask, register_commands
from queueworker.handlers import PermanentError, Registry, TaskContext


def _run(script: str, payload, timeout: float = 10.0):
    ctx = TaskContext(7, "ext", "default", 2, 3, logging.getLogger("test"))

    async def go():
        async with asyncio.timeout(timeout):
            return await CommandTask([sys.executable, "-c", script])(payload, ctx)

    return asyncio.run(go())


def test_payload_on_stdin_and_envelope_result():
    script = ("import json,os,sys; p=json.load(sys.stdin); "
              "print(json.dumps({'ok': True, 'result': {'doubled': p['n']*2, 'attempt': os.environ['QUEUEWORKER_ATTEMPT']}}))")
    assert _run(script, {"n": 21}) == {"doubled": 42, "attempt": "2"}


def test_plain_json_output_is_the_result_and_empty_output_is_none():
    assert _run("print('[1, 2]')", {}) == [1, 2]
    assert _run("pass", {}) is None


def test_non_zero_exit_is_retryable_with_stderr_tail():
    with pytest.raises(CommandFailed, match="status 3: boom"):
        _run("import sys; sys.stderr.write('boom'); sys.exit(3)", {})


def test_envelope_can_fail_permanently_or_retryably():
    with pytest.raises(PermanentError, match="invalid input"):
        _run("print('{\"ok\": false, \"error\": \"invalid input\", \"retryable\": false}')", {})
    with pytest.raises(CommandFailed, match="try later"):
        _run("print('{\"ok\": false, \"error\": \"try later\"}')", {})


def test_garbage_on_stdout_is_a_permanent_error():
    with pytest.raises(PermanentError, match="no JSON"):
        _run("print('hello')", {})


def test_timeout_kills_the_whole_process_group(tmp_path):
    marker = tmp_path / "child-alive"
    script = (f"import subprocess,sys,time; subprocess.Popen([sys.executable,'-c',"
              f"'import time,pathlib; time.sleep(1.5); pathlib.Path(r\"{marker}\").write_text(\"x\")']); time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        _run(script, {}, timeout=0.5)
    assert time.monotonic() - started < 8
    time.sleep(2.0)
    assert not marker.exists(), "the grandchild survived the kill"


def test_register_commands_parses_name_equals_command():
    registry = Registry()
    register_commands(registry, ["resize=python3 resize.py --fast"])
    assert "resize" in registry
    with pytest.raises(ValueError, match="NAME=COMMAND"):
        register_commands(registry, ["no-equals-sign"])

"""The external-process executor, with real child processes (no database needed)."""

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from queueworker.runtime.external import CommandFailed, CommandTask, OutputTooLarge, register_commands
from queueworker.runtime.handlers import PermanentError, Registry, TaskContext
from tests.support import wait_until


def _run(script: str, payload, timeout: float = 10.0, **options):
    ctx = TaskContext(7, "ext", "default", 2, 3, logging.getLogger("test"))

    async def go():
        async with asyncio.timeout(timeout):
            return await CommandTask([sys.executable, "-c", script], **options)(payload, ctx)

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
    marker, pid_file = tmp_path / "child-alive", tmp_path / "grandchild.pid"
    script = (f"import pathlib,subprocess,sys,time; grandchild = subprocess.Popen([sys.executable,'-c',"
              f"'import time,pathlib; time.sleep(1.5); pathlib.Path(r\"{marker}\").write_text(\"x\")']); "
              f"pathlib.Path(r\"{pid_file}\").write_text(str(grandchild.pid)); time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        _run(script, {}, timeout=0.5)
    assert time.monotonic() - started < 8
    if pid_file.exists():  # else the kill came before the child started it
        grandchild = int(pid_file.read_text())
        wait_until(lambda: _ended(grandchild), timeout=5, interval=0.02, message="the grandchild to end")
    assert not marker.exists(), "the grandchild survived the kill"


def _ended(pid: int) -> bool:
    """Whether process `pid` has ended: gone, or a zombie its new parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _pipes() -> set[str]:
    """The pipes this process holds open (their /proc/self/fd targets)."""
    fds = Path("/proc/self/fd")
    targets = set()
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # the directory's own descriptor, closed by now
            continue
        if target.startswith("pipe:"):
            targets.add(target)
    return targets


def test_a_process_that_left_the_group_does_not_keep_the_pipes_open(tmp_path):
    """A command that starts a daemon of its own session and exits: the daemon holds the command's
    stdout and stderr, so they never end and the task runs into its deadline, and the kill of the
    command's group does not reach it. Our ends of the pipes are closed all the same."""
    pid_file = tmp_path / "daemon.pid"
    script = (f"import pathlib,subprocess,sys; daemon = subprocess.Popen([sys.executable,'-c','import time; "
              f"time.sleep(120)'], start_new_session=True); pathlib.Path(r'{pid_file}').write_text(str(daemon.pid))")
    ctx = TaskContext(7, "ext", "default", 1, 3, logging.getLogger("test"))

    async def go() -> tuple[set[str], set[str]]:
        before = _pipes()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0):
                await CommandTask([sys.executable, "-c", script])({}, ctx)
        for _ in range(200):  # a transport closes its pipes on the loop's next turns
            if _pipes() <= before:
                break
            await asyncio.sleep(0.01)
        return before, _pipes()

    try:
        before, after = asyncio.run(go())
        assert pid_file.exists(), "the command did not start its daemon"
        left_open = sorted(after - before)
        assert left_open == []
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_register_commands_parses_name_equals_command():
    registry = Registry()
    register_commands(registry, ["resize=python3 resize.py --fast"])
    assert "resize" in registry
    with pytest.raises(ValueError, match="NAME=COMMAND"):
        register_commands(registry, ["no-equals-sign"])


def test_stdout_past_the_limit_fails_permanently_without_reading_it_all():
    script = "import sys\nfor _ in range(10000): sys.stdout.write('x' * 10000)"
    with pytest.raises(OutputTooLarge, match="more than 65,536 bytes"):
        _run(script, {}, output_limit_bytes=65536)


def test_only_a_tail_of_stderr_is_kept_nul_bytes_included():
    script = ("import sys; sys.stderr.write('early noise ' * 200000); sys.stderr.buffer.write(b'\\x00the cause');"
              " sys.exit(1)")
    with pytest.raises(CommandFailed) as caught:
        _run(script, {})
    message = str(caught.value)
    assert message.startswith("command exited with status 1: ") and message.endswith("\\x00the cause")
    assert len(message) < 1600


def test_commands_see_an_allow_listed_environment(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://app:secret@db/app")
    monkeypatch.setenv("SERVICE_TOKEN", "t0ken")
    script = "import json, os; print(json.dumps(sorted(k for k in os.environ if not k.startswith('LC_'))))"
    seen = _run(script, {})
    assert "DATABASE_URL" not in seen and "SERVICE_TOKEN" not in seen
    assert {"PATH", "QUEUEWORKER_TASK_ID", "QUEUEWORKER_ATTEMPT", "QUEUEWORKER_TASK", "QUEUEWORKER_QUEUE"} <= set(seen)
    assert "SERVICE_TOKEN" in _run(script, {}, pass_env=["SERVICE_TOKEN"])


@pytest.mark.parametrize("stdout, fragment", [
    ("[" * 3000 + "]" * 3000, "nested too deeply"),
    ("9" * 5000, "4,300 digits"),
])
def test_json_python_cannot_read_fails_permanently(stdout, fragment):
    with pytest.raises(PermanentError, match=fragment):
        _run(f"print({stdout!r})", {})

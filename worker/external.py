"""External-process executor: run a configured command per task.

The payload goes to the command's stdin as JSON. On exit 0 its stdout is the result: either
a JSON envelope `{"ok": true, "result": ...}` / `{"ok": false, "error": "...", "retryable": bool}`,
any other JSON value (taken as the result), or nothing (result null). A non-zero exit fails the
attempt retryably, with the tail of stderr as the message. On deadline or cancellation the
command's whole process group gets SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
from typing import Any

from .handlers import PermanentError, Registry, TaskContext

KILL_GRACE_SECONDS = 5.0
STDERR_TAIL = 2000


class CommandFailed(RuntimeError):
    """The command exited non-zero or reported a retryable failure."""


class CommandTask:
    """An async handler that runs `argv` for each task."""

    def __init__(self, argv: list[str]):
        if not argv:
            raise ValueError("empty command")
        self.argv = argv

    async def __call__(self, payload: Any, ctx: TaskContext) -> Any:
        env = {**os.environ, "QUEUEWORKER_TASK_ID": str(ctx.task_id), "QUEUEWORKER_ATTEMPT": str(ctx.attempt),
               "QUEUEWORKER_TASK": ctx.task, "QUEUEWORKER_QUEUE": ctx.queue}
        proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        try:
            stdout, stderr = await proc.communicate(json.dumps(payload).encode())
        except BaseException:
            await _terminate(proc)
            raise
        return _interpret(proc.returncode, stdout, stderr)


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the process group, SIGKILL it after the grace period; never raises."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            async with asyncio.timeout(wait):
                await asyncio.shield(proc.wait())
            return
        except TimeoutError:
            continue
        except asyncio.CancelledError:
            os.killpg(proc.pid, signal.SIGKILL)
            raise


def _interpret(returncode: int, stdout: bytes, stderr: bytes) -> Any:
    tail = stderr.decode(errors="replace")[-STDERR_TAIL:].strip()
    text = stdout.decode(errors="replace").strip()
    if returncode != 0:
        envelope = _parse(text)
        if isinstance(envelope, dict) and envelope.get("ok") is False:
            _raise_envelope_error(envelope, tail)
        raise CommandFailed(f"command exited with status {returncode}" + (f": {tail}" if tail else ""))
    if not text:
        return None
    envelope = _parse(text)
    if envelope is _NOT_JSON:
        raise PermanentError(f"command printed no JSON on stdout: {text[:200]!r}")
    if isinstance(envelope, dict) and "ok" in envelope:
        if envelope["ok"] is True:
            return envelope.get("result")
        _raise_envelope_error(envelope, tail)
    return envelope


_NOT_JSON = object()


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON


def _raise_envelope_error(envelope: dict, stderr_tail: str) -> None:
    message = str(envelope.get("error") or "command reported failure")
    if stderr_tail:
        message = f"{message} (stderr: {stderr_tail[-500:]})"
    if envelope.get("retryable", True):
        raise CommandFailed(message)
    raise PermanentError(message)


def register_commands(registry: Registry, specs: list[str]) -> None:
    """Registers `NAME=COMMAND LINE` specs (from `--command`) as handlers."""
    for spec in specs:
        name, sep, command = spec.partition("=")
        if not sep or not name.strip() or not command.strip():
            raise ValueError(f"--command needs NAME=COMMAND, got {spec!r}")
        registry.register(CommandTask(shlex.split(command)).__call__, name.strip())

"""External-process executor: run a configured command per task.

The payload goes to the command's stdin as JSON. On exit 0 its stdout is the result: either
a JSON envelope `{"ok": true, "result": ...}` / `{"ok": false, "error": "...", "retryable": bool}`,
any other JSON value (taken as the result), or nothing (result null). A non-zero exit fails the
attempt retryably, with the tail of stderr as the message. On deadline or cancellation the
command's whole process group gets SIGTERM, then SIGKILL after a grace period.

A command is not trusted with more than it needs: it sees a small allow-listed environment (the
worker's own DATABASE_URL is not passed unless configured), and what it prints is bounded — stdout
up to a limit (past it the attempt fails permanently), stderr only as a tail.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
from collections.abc import Iterable
from typing import Any

from .. import jsonvalue
from .handlers import PermanentError, Registry, TaskContext
from ..settings import WorkerSettings

KILL_GRACE_SECONDS = 5.0
STDERR_TAIL = 2000  # bytes of stderr kept while reading
STDERR_TAIL_CHARS = 1500  # of those, characters kept in an error message once escaped
READ_CHUNK = 64 * 1024
# Passed to every command when set in the worker's environment; anything else only when listed
# in WorkerSettings.command_env.
BASE_ENV = ("PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


class CommandFailed(RuntimeError):
    """The command exited non-zero or reported a retryable failure."""


class OutputTooLarge(PermanentError):
    """The command printed more on stdout than the configured limit."""


class CommandTask:
    """An async handler that runs `argv` for each task."""

    def __init__(self, argv: list[str], pass_env: Iterable[str] = (), output_limit_bytes: int | None = None):
        if not argv:
            raise ValueError("empty command")
        self.argv = argv
        self.pass_env = tuple(dict.fromkeys((*BASE_ENV, *pass_env)))
        self.output_limit_bytes = (output_limit_bytes
                                   or WorkerSettings.model_fields["command_output_limit_bytes"].default)

    def environment(self, ctx: TaskContext) -> dict[str, str]:
        env = {name: os.environ[name] for name in self.pass_env if name in os.environ}
        env.update(QUEUEWORKER_TASK_ID=str(ctx.task_id), QUEUEWORKER_ATTEMPT=str(ctx.attempt),
                   QUEUEWORKER_TASK=ctx.task, QUEUEWORKER_QUEUE=ctx.queue)
        return env

    async def __call__(self, payload: Any, ctx: TaskContext) -> Any:
        proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=self.environment(ctx), start_new_session=True)
        stderr_tail = bytearray()
        io = [asyncio.ensure_future(step) for step in (
            _feed(proc, jsonvalue.encode(payload).encode()), self._read_stdout(proc), _read_tail(proc, stderr_tail),
            proc.wait())]
        try:
            _, stdout, _, returncode = await asyncio.gather(*io)
        except BaseException:
            for step in io:  # gather leaves the others running
                step.cancel()
            await _terminate(proc)
            await asyncio.gather(*io, return_exceptions=True)
            raise
        finally:
            _close_pipes(proc)
        return _interpret(returncode, stdout, bytes(stderr_tail))

    async def _read_stdout(self, proc: asyncio.subprocess.Process) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := await proc.stdout.read(READ_CHUNK):
            size += len(chunk)
            if size > self.output_limit_bytes:
                raise OutputTooLarge(f"command printed more than {self.output_limit_bytes:,} bytes on stdout")
            chunks.append(chunk)
        return b"".join(chunks)


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    """Writes the payload; a command that exits without reading it all is not an error here."""
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        proc.stdin.close()


async def _read_tail(proc: asyncio.subprocess.Process, tail: bytearray) -> None:
    """Reads stderr to the end, keeping only its last STDERR_TAIL bytes (where the cause usually is)."""
    while chunk := await proc.stderr.read(READ_CHUNK):
        tail += chunk
        del tail[:-STDERR_TAIL]


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


def _close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Closes our ends of the command's pipes. asyncio closes them once the command has exited and
    every pipe has reached its end, but a process that left the command's process group (a daemon
    it started) keeps the pipes it inherited open, and past the kill they would stay open as long as
    it lives: file descriptors the worker leaks, and a transport left for the garbage collector
    after the event loop closed. asyncio.subprocess.Process has no public close."""
    proc._transport.close()


def _interpret(returncode: int, stdout: bytes, stderr: bytes) -> Any:
    # Escaped (NUL bytes and the like spelled out) and cut here, keeping its end: the cause.
    tail = jsonvalue.safe_text(stderr.decode(errors="replace").strip(), limit=STDERR_TAIL_CHARS, keep_end=True)
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
        return jsonvalue.decode(text)
    except jsonvalue.InvalidJson:
        return _NOT_JSON
    except jsonvalue.Undecodable as exc:
        raise PermanentError(f"command printed JSON that cannot be read: {exc}") from None


def _raise_envelope_error(envelope: dict, stderr_tail: str) -> None:
    message = str(envelope.get("error") or "command reported failure")
    if stderr_tail:
        message = f"{message} (stderr: {stderr_tail[-500:]})"
    if envelope.get("retryable", True):
        raise CommandFailed(message)
    raise PermanentError(message)


def register_commands(registry: Registry, specs: list[str], settings: WorkerSettings | None = None) -> None:
    """Registers `NAME=COMMAND LINE` specs (from `--command`) as handlers, with the environment
    allow-list and output limit of `settings`."""
    settings = settings or WorkerSettings()
    for spec in specs:
        name, sep, command = spec.partition("=")
        if not sep or not name.strip() or not command.strip():
            raise ValueError(f"--command needs NAME=COMMAND, got {spec!r}")
        task = CommandTask(shlex.split(command), settings.command_env, settings.command_output_limit_bytes)
        registry.register(task.__call__, name.strip())

"""`queueworker worker --processes N`: one supervisor process running N worker processes, for a pod
with several CPUs (one Python process uses one core for its own code).

The supervisor does no queue work. It has imported the worker's modules once, and forks each worker,
which runs `queueworker worker` with the same arguments (and `--processes 1`): a forked worker
starts without importing psycopg, pydantic and the worker again (about 250 ms of CPU each, N of
them at once on the pod's cores), and shares the imported modules' memory with its siblings until
it writes to it. Nothing of the user's (handler modules, Django) is imported before the fork, and
the supervisor has no thread, event loop or connection to hand down. It forwards SIGTERM and
SIGINT to all of them (a second signal is forwarded too, and hurries their drains), and exits 0
only if every worker drained cleanly. A worker that ends on its own while nobody asked it to stop
is started again after a backoff, like a crashed container; one that refuses its arguments (exit
2) stops them all, since its siblings share the mistake. The workers ask the kernel for SIGTERM if
the supervisor dies (Linux), so a SIGKILLed supervisor never leaves orphans claiming work.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from ..backoff import backoff

log = logging.getLogger("queueworker.processes")

EXIT_USAGE = 2
EXIT_UNCLEAN = 1
# How often the supervisor looks at its workers (it has no other work).
POLL_SECONDS = 0.2
# A worker that ended on its own is restarted after a backoff that doubles up to this cap, and
# starts over once a worker has run this long.
RESTART_BACKOFF_SECONDS = (1.0, 30.0)
STABLE_RUN_SECONDS = 60.0
MAX_PORT = 65535
_PR_SET_PDEATHSIG = 1
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


@dataclass
class _Slot:
    """One worker process position: its current process and its restart history."""

    index: int
    metrics_port: int | None
    pid: int | None = None  # the worker process running in this position
    started: float = 0.0
    restarts: int = 0
    restart_at: float = 0.0
    exit_codes: list[int] = field(default_factory=list)


def worker_argv(argv: Sequence[str], metrics_port: int | None) -> list[str]:
    """The arguments of one worker: the supervisor's own, made to run one process (a later flag wins
    in argparse, and the environment's QUEUEWORKER_PROCESSES is overridden), with its metrics port."""
    port = [] if metrics_port is None else ["--metrics-port", str(metrics_port)]
    return [*argv, "--processes", "1", *port]


def metrics_ports(first: int | None, count: int) -> list[int | None]:
    """The port each of `count` workers serves metrics on: worker i on `first` + i (each on 0, any
    free port, when `first` is 0). ValueError, naming the range, when the last is not a port."""
    if first is None or first == 0:
        return [first] * count
    last = first + count - 1
    if last > MAX_PORT:
        raise ValueError(f"--metrics-port {first} with {count} processes needs ports {first}-{last}, past "
                         f"{MAX_PORT}: use a port of at most {MAX_PORT - count + 1}")
    return [first + index for index in range(count)]


def run_processes(argv: Sequence[str], ports: Sequence[int | None]) -> int:
    """Runs one worker per entry of `ports` (its metrics port, from metrics_ports) until a stop
    signal and their drains; returns the exit code."""
    # The CLI imported the worker's modules before it chose to supervise (cli.worker.cmd_worker): the
    # forked workers start with them, and share their memory. The collector must not write to (and
    # so copy) every page of it in each worker.
    gc.freeze()
    count = len(ports)
    slots = [_Slot(i, ports[i]) for i in range(count)]
    stops = 0

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stops
        stops += 1
        log.info("%s: stopping %d workers", signal.Signals(signum).name, count)
        for slot in slots:
            if slot.pid is not None:
                _signal(slot.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        log.info("starting %d worker processes", count, extra={"processes": count})
        for slot in slots:
            _start(slot, argv)
        while True:
            now = time.monotonic()
            for slot in slots:
                if slot.pid is None:
                    if not stops and now >= slot.restart_at:
                        _start(slot, argv)
                    continue
                code = _exit_code(slot.pid)
                if code is None:
                    continue
                slot.exit_codes.append(code)
                slot.pid = None
                if stops:
                    continue
                if code == EXIT_USAGE:
                    log.error("worker %d refused its arguments (exit 2): stopping them all", slot.index)
                    on_signal(signal.SIGTERM, None)
                    stops = max(stops, 1)
                    continue
                _schedule_restart(slot, code, now)
            if stops and all(slot.pid is None for slot in slots):
                break
            time.sleep(POLL_SECONDS)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for slot in slots:  # only if the supervisor itself failed: leave nothing behind
            if slot.pid is not None:
                _signal(slot.pid, signal.SIGKILL)
                os.waitpid(slot.pid, 0)
    last = [slot.exit_codes[-1] for slot in slots if slot.exit_codes]
    failed = [code for code in last if code != 0]
    log.info("worker processes stopped", extra={"exit_codes": last})
    if EXIT_USAGE in failed:
        return EXIT_USAGE
    return EXIT_UNCLEAN if failed or len(last) < count else 0


def _start(slot: _Slot, argv: Sequence[str]) -> None:
    """Forks the worker of `slot`. The stop signals are blocked across the fork: the worker must not
    run the supervisor's handler (which signals the worker's siblings) before it has put back the
    default one, and a stop meant for the supervisor must not be lost either."""
    supervisor = os.getpid()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        pid = os.fork()
        if pid == 0:
            _run_worker(worker_argv(argv, slot.metrics_port), supervisor, previous)
        slot.pid = pid  # before a stop that came meanwhile is handled: it must reach this worker too
        slot.started = time.monotonic()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _run_worker(argv: list[str], supervisor: int, mask: set[signal.Signals]) -> NoReturn:
    """The forked worker: runs `queueworker worker` with `argv` as a process started anew would, and
    exits with its code, never returning into the supervisor's code (whose `finally` would signal
    its siblings). The exit handlers registered meanwhile (a tracing SDK flushing its spans) run
    first, as they do at the end of an interpreter."""
    code = EXIT_UNCLEAN
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the handlers of a fresh interpreter
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _die_with_parent()
        if os.getppid() != supervisor:  # it died before the kernel was asked: nothing started, nothing to drain
            raise SystemExit(EXIT_UNCLEAN)
        from ..cli import main

        code = main(argv)
    except SystemExit as exc:  # as the interpreter ends on it: None is success, a message is printed
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else EXIT_UNCLEAN
    except BaseException:  # noqa: BLE001 - a bug of the worker's: its traceback, and the exit code of one
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _exit_code(pid: int) -> int | None:
    """The worker's exit code once it has ended (reaped), negative for a signal; None while it runs."""
    ended, status = os.waitpid(pid, os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if ended else None


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # ended meanwhile: reaped at the next look
        pass


def _schedule_restart(slot: _Slot, code: int, now: float) -> None:
    if now - slot.started >= STABLE_RUN_SECONDS:
        slot.restarts = 0
    first, cap = RESTART_BACKOFF_SECONDS
    wait = backoff(slot.restarts, first, cap)
    slot.restarts += 1
    slot.restart_at = now + wait
    log.warning("worker %d ended on its own (exit %d): starting it again in %.0fs", slot.index, code, wait,
                extra={"exit_code": code, "restarts": slot.restarts})


def _die_with_parent() -> None:
    """In the worker: SIGTERM (a drain) when the supervisor dies, however it dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

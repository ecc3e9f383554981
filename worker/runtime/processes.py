"""`queueworker worker --processes N`: one supervisor process running N worker processes, for a pod
with several CPUs (one Python process uses one core for its own code).

The supervisor does no queue work. It starts each worker as `queueworker worker` with the same
arguments (and `--processes 1`), forwards SIGTERM and SIGINT to all of them (a second signal is
forwarded too, and hurries their drains), and exits 0 only if every worker drained cleanly. A
worker that ends on its own while nobody asked it to stop is started again after a backoff, like
a crashed container; one that refuses its arguments (exit 2) stops them all, since its siblings
share the mistake. The workers ask the kernel for SIGTERM if the supervisor dies (Linux), so a
SIGKILLed supervisor never leaves orphans claiming work.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

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


@dataclass
class _Slot:
    """One worker process position: its current process and its restart history."""

    index: int
    metrics_port: int | None
    process: subprocess.Popen | None = None
    started: float = 0.0
    restarts: int = 0
    restart_at: float = 0.0
    exit_codes: list[int] = field(default_factory=list)


def worker_argv(argv: Sequence[str]) -> list[str]:
    """The command line of one worker: the supervisor's own arguments, made to run one process
    (a later flag wins in argparse, and the environment's QUEUEWORKER_PROCESSES is overridden)."""
    return [sys.executable, "-m", "queueworker.cli", *argv, "--processes", "1"]


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
    command = worker_argv(argv)
    count = len(ports)
    slots = [_Slot(i, ports[i]) for i in range(count)]
    stops = 0

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stops
        stops += 1
        log.info("%s: stopping %d workers", signal.Signals(signum).name, count)
        for slot in slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        log.info("starting %d worker processes", count, extra={"processes": count})
        for slot in slots:
            _start(slot, command)
        while True:
            now = time.monotonic()
            for slot in slots:
                if slot.process is None:
                    if not stops and now >= slot.restart_at:
                        _start(slot, command)
                    continue
                code = slot.process.poll()
                if code is None:
                    continue
                slot.exit_codes.append(code)
                slot.process = None
                if stops:
                    continue
                if code == EXIT_USAGE:
                    log.error("worker %d refused its arguments (exit 2): stopping them all", slot.index)
                    on_signal(signal.SIGTERM, None)
                    stops = max(stops, 1)
                    continue
                _schedule_restart(slot, code, now)
            if stops and all(slot.process is None for slot in slots):
                break
            time.sleep(POLL_SECONDS)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for slot in slots:  # only if the supervisor itself failed: leave nothing behind
            if slot.process is not None and slot.process.poll() is None:
                slot.process.kill()
    last = [slot.exit_codes[-1] for slot in slots if slot.exit_codes]
    failed = [code for code in last if code != 0]
    log.info("worker processes stopped", extra={"exit_codes": last})
    if EXIT_USAGE in failed:
        return EXIT_USAGE
    return EXIT_UNCLEAN if failed or len(last) < count else 0


def _start(slot: _Slot, command: list[str]) -> None:
    if slot.metrics_port is not None:
        command = [*command, "--metrics-port", str(slot.metrics_port)]
    slot.process = subprocess.Popen(command, preexec_fn=_die_with_parent)
    slot.started = time.monotonic()


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
    """In the child, before exec: SIGTERM (a drain) when the supervisor dies, however it dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

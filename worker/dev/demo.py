"""`queueworker demo`: the whole system on one machine, with nothing but Python.

A throwaway Postgres (`localpg`: system binaries, else the `pgserver` wheel), a burst of
`qw.sleep` tasks, and a fleet of local `queueworker worker` processes scaled by the controller's
own policy (`queueworker.scaling.policy.decide`, the same function that scales pods). A
process stands in for a pod: scale-out starts one, scale-in sends SIGTERM to the least busy, which
drains and hands its leases back, exactly as a pod does when its Deployment shrinks.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..client.producer import TaskSpec, enqueue_many
from ..db import statements
from ..db.inspect import TASK_STATE_COUNTS, WORKER_LOADS, TaskIdsParams, WorkerLoadsParams
from ..db.migrate import migrate
from ..names import QUEUE_PATTERN
from .localpg import LocalPostgres

if TYPE_CHECKING:  # imported where the demo scales: the CLI's parser imports this module for every command
    from ..scaling.policy import Decision, QueueDepth, ScalingParams

TERMINAL_STATES = ("succeeded", "failed", "cancelled")
MAX_CRASHES = 3  # workers that exit unasked before the demo gives up (bad DSN, broken install)
EXIT_INTERRUPTED = 130


class DemoConfig(BaseModel):
    """The demo's knobs; the scaling ones mean what the QueueWorker's `spec.scaling` fields mean."""

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)  # the CLI reads only its defaults

    tasks: int = Field(default=300, ge=1, le=100_000)
    task_seconds: float = Field(default=1.0, ge=0)
    queue: str = Field(default="demo", pattern=QUEUE_PATTERN)
    concurrency: int = Field(default=5, ge=1, le=1000)
    tasks_per_worker: int | None = Field(default=None, ge=1)
    min_workers: int = Field(default=0, ge=0)
    max_workers: int = Field(default=8, ge=1, le=64)
    interval: float = Field(default=1.0, gt=0)
    scale_down_window: float = Field(default=5.0, ge=0)
    cooldown: float = Field(default=5.0, ge=0)
    drain_seconds: float = Field(default=5.0, ge=0)
    timeout: float | None = Field(default=None, gt=0)
    dsn: str | None = None
    no_tty: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> DemoConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) exceeds max_workers ({self.max_workers})")
        return self

    @property
    def scaling(self) -> ScalingParams:
        from ..scaling.policy import ScalingParams

        return ScalingParams(min_replicas=self.min_workers, max_replicas=self.max_workers,
                             tasks_per_replica=self.tasks_per_worker or self.concurrency,
                             scale_down_stabilization_seconds=self.scale_down_window,
                             cooldown_seconds=self.cooldown)


@dataclass(frozen=True)
class Tick:
    """What one supervision round saw and decided."""

    elapsed: float
    depth: QueueDepth
    states: Mapping[str, int]
    total: int
    decision: Decision
    workers: int
    draining: int
    rate: float

    @property
    def finished(self) -> int:
        return sum(self.states.get(state, 0) for state in TERMINAL_STATES)

    def line(self) -> str:
        """One line per tick for logs and CI (`--no-tty`)."""
        return (f"t={self.elapsed:6.1f}s ready={self.depth.ready} running={self.depth.running} "
                f"done={self.finished}/{self.total} desired={self.decision.desired_replicas} "
                f"workers={self.workers} draining={self.draining} rate={self.rate:.1f}/s "
                f"reason={self.decision.reason}")

    def panel(self, width: int = 30) -> list[str]:
        """The live view on a terminal: a progress bar, the queue, the fleet, the policy's reason."""
        filled = round(width * self.finished / self.total)
        return [
            f"[{'#' * filled}{'.' * (width - filled)}] {self.finished}/{self.total} done "
            f"{self.elapsed:6.1f}s  {self.rate:5.1f} tasks/s",
            f"queue    ready {self.depth.ready:>6}   running {self.depth.running:>5}",
            f"workers  desired {self.decision.desired_replicas:>4}   actual {self.workers:>6}"
            + (f"   draining {self.draining}" if self.draining else ""),
            f"policy   {self.decision.reason}: {self.decision.message}",
        ]


class CompletionRate:
    """Tasks finished per second over a sliding window, from cumulative counts."""

    def __init__(self, window_seconds: float = 5.0):
        self.window = window_seconds
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, finished: int) -> float:
        self.samples.append((now, finished))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def scale_in_victims(pids: Sequence[int], loads: Mapping[int, int], count: int) -> list[int]:
    """The `count` workers to stop, from `pids` in start order: fewest leased tasks first (least
    work to hand back), the newest among equals. A worker not registered yet has no leases."""
    start_order = {pid: i for i, pid in enumerate(pids)}
    return sorted(pids, key=lambda pid: (loads.get(pid, 0), -start_order[pid]))[:count]


@dataclass
class Summary:
    tasks: int
    states: Mapping[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    scale_ups: int = 0
    scale_downs: int = 0
    workers_started: int = 0
    peak_workers: int = 0
    leases_held_at_exit: int = 0
    interrupted: bool = False

    @property
    def succeeded(self) -> int:
        return self.states.get("succeeded", 0)

    @property
    def all_succeeded(self) -> bool:
        return self.succeeded == self.tasks and not self.interrupted

    def render(self) -> str:
        others = ", ".join(f"{n} {state}" for state, n in sorted(self.states.items()) if state != "succeeded")
        throughput = self.succeeded / self.seconds if self.seconds > 0 else 0.0
        return "\n".join([
            "summary" + (" (interrupted)" if self.interrupted else ""),
            f"  tasks       {self.succeeded}/{self.tasks} succeeded" + (f" ({others})" if others else ""),
            f"  time        {self.seconds:.1f}s",
            f"  throughput  {throughput:.1f} tasks/s",
            f"  scaling     scale-ups {self.scale_ups}, scale-downs {self.scale_downs}, "
            f"workers started {self.workers_started}, peak {self.peak_workers}",
            f"  leases      {self.leases_held_at_exit} still held after shutdown",
        ])


@dataclass
class WorkerFleet:
    """Local `queueworker worker` processes standing in for a Deployment's pods."""

    dsn: str
    config: DemoConfig
    log_dir: Path
    active: dict[int, subprocess.Popen] = field(default_factory=dict)  # in start order
    draining: dict[int, subprocess.Popen] = field(default_factory=dict)
    started: int = 0
    crashed: list[str] = field(default_factory=list)
    logs: dict[int, Path] = field(default_factory=dict)

    def command(self) -> list[str]:
        """The worker's command line. Without the DSN, which holds a password any local user could
        read from argv: the workers get it as DATABASE_URL (see environment)."""
        return [sys.executable, "-m", "queueworker.cli", "worker", "--builtin-tasks", "--queue", self.config.queue,
                "--concurrency", str(self.config.concurrency), "--drain-seconds", str(self.config.drain_seconds),
                "--lease-seconds", "10", "--heartbeat-seconds", "2",
                "--log-format", "text", "--log-level", "WARNING"]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "DATABASE_URL": self.dsn}

    def scale_to(self, desired: int, loads: Callable[[list[int]], Mapping[int, int]]) -> int:
        """Starts or stops workers to reach `desired`; returns the change in size."""
        change = desired - len(self.active)
        for _ in range(change):
            self.started += 1
            log_path = self.log_dir / f"worker-{self.started}.log"
            with log_path.open("wb") as log:
                # A session of its own: the terminal's Ctrl-C reaches the demo only, which then
                # stops every worker itself, as a kubelet would.
                proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            self.active[proc.pid] = proc
            self.logs[proc.pid] = log_path
        if change < 0:
            pids = list(self.active)
            for pid in scale_in_victims(pids, loads(pids), -change):
                self.draining[pid] = self.active.pop(pid)
                self.draining[pid].send_signal(signal.SIGTERM)
        return change

    def reap(self) -> None:
        """Forgets exited processes; an active one that exited was not asked to: it is reported."""
        for pid, proc in list(self.draining.items()):
            if proc.poll() is not None:
                del self.draining[pid]
        for pid, proc in list(self.active.items()):
            if proc.poll() is not None:
                del self.active[pid]
                tail = self.logs[pid].read_text(errors="replace").strip().splitlines()[-1:]
                self.crashed.append(f"worker pid {pid} exited with status {proc.returncode}: "
                                    f"{tail[0] if tail else '(no output)'}")

    def signal_all(self, sig: int) -> None:
        for proc in [*self.active.values(), *self.draining.values()]:
            if proc.poll() is None:
                proc.send_signal(sig)

    def stop_all(self, grace_seconds: float) -> None:
        """SIGTERM to every active worker (they drain and release leases; those already draining
        carry on), SIGKILL to any still there after the grace period."""
        for proc in self.active.values():
            proc.send_signal(signal.SIGTERM)
        self.draining.update(self.active)
        self.active.clear()
        deadline = time.monotonic() + grace_seconds
        for proc in self.draining.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.draining.clear()


class Shutdown:
    """SIGINT/SIGTERM: the first asks for a graceful stop, later ones cut the workers' drain short."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.on_repeat: Callable[[], None] = lambda: None

    def __call__(self, signum: int, frame: object) -> None:
        if self.requested.is_set():
            self.on_repeat()
        self.requested.set()


class Display:
    """A live panel on a terminal, or one line per tick otherwise."""

    def __init__(self, live: bool):
        self.live = live
        self.drawn = 0

    def show(self, tick: Tick) -> None:
        if not self.live:
            print(tick.line(), flush=True)
            return
        width = shutil.get_terminal_size().columns
        lines = [line[:width - 1] for line in tick.panel()]
        sys.stdout.write(f"\x1b[{self.drawn}F" if self.drawn else "")
        sys.stdout.write("".join(f"\x1b[2K{line}\n" for line in lines))
        sys.stdout.flush()
        self.drawn = len(lines)

    def note(self, message: str) -> None:
        self.drawn = 0
        print(message, flush=True)


def run_demo(config: DemoConfig) -> int:
    """Runs the demo; exit status 0 only when every task succeeded."""
    display = Display(live=not config.no_tty and sys.stdout.isatty())
    shutdown = Shutdown()
    previous = {sig: signal.signal(sig, shutdown) for sig in (signal.SIGINT, signal.SIGTERM)}
    server: LocalPostgres | None = None
    try:
        dsn = config.dsn
        if dsn is None:
            server = LocalPostgres()
            display.note(f"starting a throwaway Postgres from {server.bin_dir}")
            dsn = server.start()
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True, application_name="queueworker-demo") as conn:
            ids = enqueue_many(conn, (TaskSpec(task="qw.sleep", payload={"seconds": config.task_seconds},
                                               queue=config.queue) for _ in range(config.tasks)))
            p = config.scaling
            display.note(f"enqueued {config.tasks} qw.sleep tasks ({config.task_seconds:g}s each) on queue "
                         f"{config.queue!r}; workers {p.min_replicas}..{p.max_replicas}, {config.concurrency} "
                         f"slots each, {p.tasks_per_replica} tasks per worker")
            fleet = WorkerFleet(dsn, config, Path(tempfile.mkdtemp(prefix="queueworker-demo-")))
            shutdown.on_repeat = lambda: fleet.signal_all(signal.SIGTERM)
            try:
                summary = _supervise(conn, fleet, ids, config, shutdown, display)
            finally:
                if fleet.active or fleet.draining:
                    display.note(f"stopping {len(fleet.active) + len(fleet.draining)} workers "
                                 f"(draining up to {config.drain_seconds:g}s)")
                fleet.stop_all(config.drain_seconds + 10)
            states = _states(conn, ids)
            summary.states, summary.leases_held_at_exit = states, states.get("running", 0)
        return _report(summary, fleet, display)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.destroy()


def _report(summary: Summary, fleet: WorkerFleet, display: Display) -> int:
    """Prints the summary, keeps the worker logs only when something went wrong; the exit status."""
    for problem in fleet.crashed:
        display.note(f"warning: {problem}")
    display.note(summary.render())
    if fleet.crashed or not (summary.all_succeeded or summary.interrupted):
        display.note(f"worker logs kept in {fleet.log_dir}")
    else:
        shutil.rmtree(fleet.log_dir, ignore_errors=True)
    if summary.interrupted:
        return EXIT_INTERRUPTED
    return 0 if summary.all_succeeded and not fleet.crashed else 1


def _supervise(conn: psycopg.Connection, fleet: WorkerFleet, ids: list[int], config: DemoConfig,
               shutdown: Shutdown, display: Display) -> Summary:
    """The controller's loop with processes for pods: read the queue, decide, scale, report.
    Ends once every task is finished and the fleet is back at its minimum."""
    from ..db.depth import QUEUE_DEPTH, QueueDepthParams
    from ..scaling.policy import PolicyInputs, QueueDepth, decide

    hostname = socket.gethostname()
    params = config.scaling
    rate = CompletionRate()
    started = time.monotonic()
    finished_at: float | None = None
    summary = Summary(config.tasks)
    decision: Decision | None = None

    def loads(pids: list[int]) -> Mapping[int, int]:
        """Leased tasks per worker process of this host: how busy each is, to pick scale-in victims."""
        rows = statements.fetch(conn, WORKER_LOADS, WorkerLoadsParams(hostname=hostname, pids=pids))
        return {row.pid: row.leased for row in rows}

    while not shutdown.requested.is_set():
        now = time.monotonic()
        fleet.reap()
        depth = QueueDepth.from_row(statements.fetch(conn, QUEUE_DEPTH, QueueDepthParams(
            queues=[config.queue], lookaheads=[None], cap=config.tasks, throughput=False))[0])
        decision = decide(PolicyInputs(
            params=params, current_replicas=len(fleet.active), depth=depth, now=time.time(),
            history=decision.history if decision else (),
            last_active_time=decision.last_active_time if decision else None))
        change = fleet.scale_to(decision.desired_replicas, loads)
        summary.scale_ups += change > 0
        summary.scale_downs += change < 0
        summary.peak_workers = max(summary.peak_workers, len(fleet.active))
        states = _states(conn, ids)
        tick = Tick(now - started, depth, states, config.tasks, decision, len(fleet.active), len(fleet.draining),
                    rate.add(now, sum(states.get(s, 0) for s in TERMINAL_STATES)))
        display.show(tick)
        if finished_at is None and tick.finished == config.tasks:
            finished_at = now
        if finished_at is not None and len(fleet.active) == params.min_replicas and not fleet.draining:
            break
        if config.timeout is not None and now - started > config.timeout:
            display.note(f"timed out after {config.timeout:g}s")
            break
        if len(fleet.crashed) >= MAX_CRASHES:
            display.note(f"giving up: {len(fleet.crashed)} workers exited unasked")
            break
        shutdown.requested.wait(max(0.0, config.interval - (time.monotonic() - now)))
    summary.interrupted = shutdown.requested.is_set()
    summary.seconds = (finished_at or time.monotonic()) - started
    summary.workers_started = fleet.started
    return summary


def _states(conn: psycopg.Connection, ids: list[int]) -> dict[str, int]:
    """The demo's own tasks by state (the database may be shared when --dsn is given)."""
    return {row.state: row.n for row in statements.fetch(conn, TASK_STATE_COUNTS, TaskIdsParams(ids=ids))}

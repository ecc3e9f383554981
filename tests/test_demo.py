"""`queueworker demo`: its pure pieces, and whole runs as a user would start them."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from queueworker.scaling.policy import Decision, QueueDepth

from queueworker.dev.demo import CompletionRate, DemoConfig, Summary, Tick, WorkerFleet, scale_in_victims
from tests.support import query, wait_until

QUEUEWORKER = str(Path(sys.executable).with_name("queueworker"))
# Small and fast: short sleeps, quick ticks, short policy windows.
FAST = ["--task-seconds", "0.2", "--concurrency", "4", "--max-workers", "4", "--interval", "0.3",
        "--scale-down-window", "1", "--cooldown", "0.5", "--drain-seconds", "3", "--timeout", "90"]


def test_scale_in_picks_the_least_busy_then_the_newest():
    pids = [101, 102, 103, 104]  # start order
    loads = {101: 3, 102: 0, 103: 2}  # 104 has not registered yet: no leases
    assert scale_in_victims(pids, loads, 1) == [104]
    assert scale_in_victims(pids, loads, 3) == [104, 102, 103]
    assert scale_in_victims(pids, {}, 2) == [104, 103]


def test_completion_rate_is_a_sliding_window():
    rate = CompletionRate(window_seconds=2.0)
    assert rate.add(0.0, 0) == 0.0
    assert rate.add(1.0, 10) == 10.0
    assert rate.add(2.0, 30) == 15.0
    assert rate.add(3.0, 30) == 10.0  # the sample at t=0 has left the window
    assert rate.add(5.0, 30) == 0.0


def test_config_maps_to_the_controllers_scaling_params():
    params = DemoConfig(concurrency=4, min_workers=1, max_workers=3, scale_down_window=2, cooldown=1).scaling
    assert (params.min_replicas, params.max_replicas, params.tasks_per_replica) == (1, 3, 4)
    assert (params.scale_down_stabilization_seconds, params.cooldown_seconds) == (2, 1)
    assert DemoConfig(concurrency=4, tasks_per_worker=10).scaling.tasks_per_replica == 10
    with pytest.raises(ValidationError, match="min_workers"):
        DemoConfig(min_workers=5, max_workers=2)


def test_tick_line_and_summary_say_what_happened():
    decision = Decision(4, "ScaledUp", "40 tasks: 2 -> 4 replicas")
    tick = Tick(1.5, QueueDepth(ready=30, running=10), {"succeeded": 20, "pending": 30, "running": 10}, 60,
                decision, workers=4, draining=1, rate=12.34)
    assert tick.finished == 20
    assert tick.line() == ("t=   1.5s ready=30 running=10 done=20/60 desired=4 workers=4 draining=1 "
                           "rate=12.3/s reason=ScaledUp")
    assert "ScaledUp: 40 tasks" in tick.panel()[-1]
    done = Summary(60, {"succeeded": 60}, seconds=3.0, scale_ups=2, scale_downs=1)
    assert done.all_succeeded and "throughput  20.0 tasks/s" in done.render()
    partial = Summary(60, {"succeeded": 50, "failed": 10}, seconds=3.0)
    assert not partial.all_succeeded and "50/60 succeeded (10 failed)" in partial.render()


class CrashingFleet(WorkerFleet):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "print('no database here'); raise SystemExit(3)"]


def test_workers_that_exit_unasked_are_reported_with_their_last_words(tmp_path):
    fleet = CrashingFleet("postgresql://unused", DemoConfig(), tmp_path)
    assert fleet.scale_to(2, loads=lambda pids: {}) == 2
    wait_until(lambda: all(p.poll() is not None for p in fleet.active.values()), timeout=10,
               message="the workers to exit")
    fleet.reap()
    assert not fleet.active
    assert fleet.crashed == [f"worker pid {pid} exited with status 3: no database here" for pid in fleet.logs]


@pytest.mark.integration
def test_demo_runs_every_task_and_scales_up_and_down():
    """The fresh-machine path: its own throwaway Postgres, no --dsn."""
    result = subprocess.run([QUEUEWORKER, "demo", "--tasks", "60", "--no-tty", *FAST],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    ticks = [line for line in out.splitlines() if line.startswith("t=")]
    assert ticks and "done=60/60" in ticks[-1] and "workers=0" in ticks[-1]
    assert "60/60 succeeded" in out and "0 still held after shutdown" in out
    scaling = re.search(r"scale-ups (\d+), scale-downs (\d+), workers started (\d+), peak (\d+)", out)
    assert scaling and int(scaling[1]) >= 1 and int(scaling[2]) >= 1 and int(scaling[4]) == 4, out


@pytest.mark.integration
def test_interrupt_drains_workers_and_releases_every_lease(dsn):
    """Tasks outlast the drain, so workers must hand their leases back."""
    proc = subprocess.Popen([QUEUEWORKER, "demo", "--tasks", "40", "--no-tty", "--dsn", dsn, *FAST,
                             "--task-seconds", "30", "--drain-seconds", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: query(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'running'")[0][0] > 0,
                   timeout=30, message="workers to lease tasks")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert "summary (interrupted)" in out and "0 still held after shutdown" in out
    assert dict(query(dsn, "SELECT state::text, count(*) FROM queueworker.tasks GROUP BY 1")) == {"pending": 40}
    assert query(dsn, "SELECT count(*) FROM queueworker.workers")[0][0] == 0

"""CI smoke of the benchmark runner: `python -m bench --quick` runs every scenario at tiny sizes
and writes its report. Benchmarks are not tests: no timing is asserted, only that the runner
still works end to end (queueworker always; peers only where they are installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from queueworker.dev.localpg import PostgresNotFound, find_bin_dir

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = ("burn", "latency", "idle", "history", "ceiling", "fanin", "flow", "enqueue")


def test_quick_benchmark_run_writes_its_report(tmp_path):
    try:
        find_bin_dir()
    except PostgresNotFound as exc:
        pytest.fail(str(exc)) if os.environ.get("CI") else pytest.skip(str(exc))
    out = tmp_path / "BENCHMARKS.md"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = out.read_text()
    assert "## Results" in report and "## Targets (queueworker)" in report
    results = json.loads((tmp_path / "benchmarks-quick.json").read_text())
    # Skipped peers say why; whatever ran, queueworker ran every scenario without an error.
    for name, reason in results["skipped"].items():
        assert reason, name
    ours = [e for e in results["errors"] if e["system"] in ("queueworker", "pgbench", "empty", "history")]
    assert not ours, ours
    assert results["burn"]["queueworker"] and results["latency"]["queueworker"]
    assert results["idle"]["queueworker"]
    assert results["history"]["empty"] and results["history"]["history"]
    assert results["ceiling"] or "ceiling" in results.get("skipped_scenarios", {})
    assert sorted(r["kind"] for r in results["fanin"]) == ["plain", "run"]
    assert "Partitioned run fan-in" in report
    assert sorted(r["limited"] for r in results["flow"]) == [False, True]
    assert "Flow control (queueworker" in report
    assert [r["tasks"] for r in results["enqueue"]["queueworker"]] == [results["config"]["enqueue_tasks"]]
    assert "Bulk enqueue (tasks/s" in report and "tembo.io" in report
    assert "its workers installed from its wheel" in report
    for name, runs in results["latency"].items():
        # every probe task ran, enqueued through the system's own API and by its raw INSERT + NOTIFY
        assert all(r["load_n"] == r["load_sent"] and r["raw_load_n"] == r["raw_load_sent"] for r in runs), name
    assert "Enqueue→start latency by enqueue path" in report
    [fleet] = results["fleet"]["3x2"]["queueworker"]
    assert fleet["load_n"] == fleet["load_sent"] and fleet["connections_max"] >= 1
    assert {"lock_waits_max", "statements_per_s", "heartbeats_per_s", "rescues_per_s"} <= fleet.keys()
    assert "3 processes × concurrency 2" in report

"""The examples in examples/ run, against a real Postgres, and do what their docstrings say."""

from __future__ import annotations

import re
import subprocess
import sys

import psycopg
import pytest

from tests.cluster.kubelet import REPO_ROOT

pytestmark = pytest.mark.integration


def test_staged_pipeline_publishes_every_item_but_the_bad_one_and_cancels_its_later_stages(dsn):
    done = subprocess.run([sys.executable, "-m", "examples.staged_pipeline", "--dsn", dsn, "--items", "4",
                           "--bad", "2"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    rows = {int(line.split()[0]): line.split()[1:] for line in done.stdout.splitlines() if re.match(r"\d", line)}
    assert rows == {1: ["succeeded"] * 3, 2: ["failed", "cancelled", "cancelled"], 3: ["succeeded"] * 3,
                    4: ["succeeded"] * 3}
    assert "fetch: item 2 is gone at the source" in done.stdout
    assert re.search(r"transform: prerequisite task \d+ ended failed", done.stdout)
    assert re.search(r"publish: prerequisite task \d+ ended cancelled \(after task \d+ ended\)", done.stdout)


def test_partitioned_export_consolidates_once_after_a_flaky_partition_and_the_watermark_bounds_the_next_run(dsn):
    done = subprocess.run([sys.executable, "-m", "examples.partitioned_export", "--dsn", dsn, "--items", "500",
                           "--partitions", "50", "--flaky", "17", "--changed", "25"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    first, second = [re.match(r"run (\d+): (\w+), consolidated (\d+) rows, most attempts of a partition (\d+), "
                              r"watermark (\S+) -> (\S+)$", line).groups() for line in done.stdout.splitlines()]
    assert first[1:5] == ("succeeded", "500", "2", "none"), "every item once; the flaky partition took two attempts"
    assert second[1:4] == ("succeeded", "25", "1"), "only the changed items, read from the watermark"
    assert second[4] == first[5], "the second run started from the watermark the first one left"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*), sum(price) FROM export_demo.canonical").fetchone() == (500, 500 * 100 + 25)
        assert conn.execute("SELECT count(*) FROM export_demo.staged").fetchone() == (0,)
        assert conn.execute("SELECT value #>> '{}' FROM queueworker.watermarks "
                            "WHERE name = 'export_demo.items'").fetchone() == (second[5],)
        partition_runs = conn.execute(
            "SELECT DISTINCT (result ->> 'staged')::int FROM queueworker.tasks "
            "WHERE run_id = %s AND run_partition IS NOT NULL", (int(first[0]),)).fetchall()
        assert partition_runs == [(10,)], "ctx.run.partition picked each partition's own 10 items"

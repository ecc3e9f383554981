"""The examples in examples/ run, against a real Postgres, and do what their docstrings say."""

from __future__ import annotations

import re
import subprocess
import sys

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

"""One version everywhere, and a wheel and sdist that install from a checkout and pass `twine check`.

The version lives in queueworker/_version.py alone: pyproject.toml reads it (setuptools' dynamic
version), and the chart's `version` and `appVersion` and the images' default VERSION label are kept
equal to it: one number names the package, the chart and the images of a release.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

import queueworker
from queueworker._version import __version__

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_chart_and_images_carry_one_version() -> None:
    assert queueworker.__version__ == __version__
    assert importlib.metadata.version("queueworker") == __version__, "reinstall: pip install -e ."
    chart = yaml.safe_load((ROOT / "charts" / "queueworker" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__)
    for dockerfile in ("Dockerfile.worker", "Dockerfile.controller"):
        (default,) = re.findall(r"^ARG VERSION=(\S+)$", (ROOT / dockerfile).read_text(), re.MULTILINE)
        assert default == __version__, dockerfile
    example = yaml.safe_load((ROOT / "examples" / "queueworker.yaml").read_text())
    assert example["spec"]["image"].rsplit(":", 1)[1] == __version__
    assert re.search(rf"^## \[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$",
                     (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE), "CHANGELOG.md has no entry for it"


@pytest.mark.packaging
def test_python_m_build_makes_a_wheel_and_sdist_that_pass_twine_check(tmp_path: Path) -> None:
    # --no-isolation: the build backend from the test extra, so no index is needed here
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel = tmp_path / f"queueworker-{__version__}-py3-none-any.whl"
    sdist = tmp_path / f"queueworker-{__version__}.tar.gz"
    assert sorted(tmp_path.iterdir()) == sorted([sdist, wheel])

    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                             capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # The versioned migrations, the function files (migrations/functions/) and the schema snapshot.
    migrations = sorted(p.relative_to(ROOT / "migrations").as_posix() for p in (ROOT / "migrations").rglob("*.sql"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"queueworker-{__version__}.dist-info/METADATA").decode()
    assert f"\nVersion: {__version__}\n" in metadata
    assert sorted(n.removeprefix("queueworker/migrations/") for n in names
                  if n.startswith("queueworker/migrations/") and n.endswith(".sql")) == migrations
    assert "functions/10_audit.sql" in migrations
    statements = sorted(p.name for p in (ROOT / "worker" / "db").glob("*.sql"))
    assert sorted(n.removeprefix("queueworker/db/") for n in names
                  if n.startswith("queueworker/db/") and n.endswith(".sql")) == statements
    assert "lease.sql" in statements
    assert {"queueworker/_version.py", "queueworker/dev/devdb.py", "queueworker_controller/operator.py"} <= set(names)
    assert not any(n.startswith("tests/") for n in names)

    with tarfile.open(sdist) as archive:
        members = {Path(*Path(name).parts[1:]).as_posix() for name in archive.getnames()}
    assert {f"migrations/{name}" for name in migrations} | {f"worker/db/{name}" for name in statements} <= members
    assert {"CHANGELOG.md", "README.md", "worker/_version.py", "charts/queueworker/Chart.yaml",
            "crds/queueworker.dev_queueworkers.yaml", "examples/queueworker.yaml"} <= members
    assert not any(m.startswith("tests/") or "__pycache__" in m for m in members)

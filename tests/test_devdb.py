"""`queueworker dev-db`: a development Postgres that outlives the command that started it, keeps its
data between starts, and is found again by `url` and `status` (integration: real server binaries)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from queueworker import cli
from queueworker.cli.local import cmd_dev_db
from queueworker.dev.devdb import EXIT_NOT_RUNNING, STATE_FILE
from queueworker.dev.localpg import PostgresNotFound, find_bin_dir
from tests.support import scalar, wait_until


# `queueworker dev-db ...` in a process of its own.
DEV_DB_COMMAND = """import sys
from queueworker import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def dev_db(directory: Path, action: str, capsys) -> tuple[int, str, str]:
    """`queueworker dev-db ACTION --dir DIRECTORY` through the CLI: (exit code, stdout, stderr)."""
    code = cli.main(["dev-db", action, "--dir", str(directory)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dev_db_dir():
    """A directory the server's user can enter when the tests run as root (pytest's tmp_path is 0700);
    any server left running in it is stopped afterwards."""
    try:
        find_bin_dir()
    except PostgresNotFound as exc:
        pytest.fail(str(exc)) if os.environ.get("CI") else pytest.skip(str(exc))
    directory = Path(tempfile.mkdtemp(prefix="queueworker-dev-db-"))
    directory.chmod(0o755)
    yield directory / "dev-db"
    cmd_dev_db(argparse.Namespace(dev_db_action="stop", dir=directory / "dev-db"))
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.integration
def test_dev_db_outlives_its_command_keeps_its_data_and_stops(dev_db_dir: Path, capsys) -> None:
    code, _, err = dev_db(dev_db_dir, "status", capsys)
    assert code == EXIT_NOT_RUNNING and "not running" in err
    assert dev_db(dev_db_dir, "url", capsys)[0] == 1

    # started by a process of its own that exits: the server must keep running
    started = subprocess.run([sys.executable, "-c", DEV_DB_COMMAND, "dev-db", "start", "--dir", str(dev_db_dir)],
                             capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr
    assert "started" in started.stderr
    assert oct((dev_db_dir / STATE_FILE).stat().st_mode & 0o777) == "0o600"

    code, url, _ = dev_db(dev_db_dir, "url", capsys)
    url = url.strip()
    assert code == 0 and url.startswith("postgresql://postgres:")
    with psycopg.connect(url, connect_timeout=10, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (note text)")
        conn.execute("INSERT INTO kept VALUES ('still here')")
    code, out, _ = dev_db(dev_db_dir, "status", capsys)
    assert code == 0 and "running" in out and url.split("@")[0] not in out  # no password in status

    assert dev_db(dev_db_dir, "start", capsys)[2].startswith("queueworker dev-db already running")

    code, _, err = dev_db(dev_db_dir, "stop", capsys)
    assert code == 0 and "stopped" in err
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=5)
    assert dev_db(dev_db_dir, "status", capsys)[0] == EXIT_NOT_RUNNING
    assert "was not running" in dev_db(dev_db_dir, "stop", capsys)[2]

    code, _, err = dev_db(dev_db_dir, "start", capsys)
    assert code == 0 and "started" in err
    assert dev_db(dev_db_dir, "url", capsys)[1].strip() == url
    with psycopg.connect(url, connect_timeout=10) as conn:
        assert conn.execute("SELECT note FROM kept").fetchall() == [("still here",)]


def test_a_damaged_state_file_is_one_line_error(tmp_path: Path, capsys) -> None:
    directory = tmp_path / "dev-db"
    directory.mkdir()
    (directory / STATE_FILE).write_text('{"port": "5432\\u0000", "password": null}')
    code, out, err = dev_db(directory, "start", capsys)
    assert code == 1 and out == ""
    assert err.startswith("queueworker: dev-db start: ") and err.count("\n") == 1
    assert "delete" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another user")
def test_as_root_a_directory_the_server_user_cannot_enter_is_refused(tmp_path: Path, capsys) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    code, _, err = dev_db(private / "dev-db", "start", capsys)
    assert code == 1 and "cannot enter" in err and "QUEUEWORKER_DEV_DB_DIR" in err


README = Path(__file__).resolve().parent.parent / "README.md"


def _by_hand_commands() -> list[str]:
    """The commands of the README's "Try it by hand", as written (comments cut)."""
    readme = README.read_text()
    section = readme[readme.index("## Try it by hand"):]
    start = section.index("```bash\n") + len("```bash\n")
    block = section[start:section.index("\n```", start)]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.integration
def test_the_readmes_by_hand_section_runs_as_written(dev_db_dir: Path) -> None:
    """Every command of the section in a shell of its own, with the environment the section builds
    up. The first line makes the environment these tests run in (the packaging tests install the
    package); the worker runs until its tasks are done, then gets the Ctrl-C the section mentions."""
    setup, *commands = _by_hand_commands()
    assert setup.startswith("python3 -m venv .venv && .venv/bin/pip install -e '.[embedded]'"), setup
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "QUEUEWORKER_DEV_DB_DIR": str(dev_db_dir)}
    env.pop("DATABASE_URL", None)
    ran = []
    for command in commands:
        if command.startswith("export "):
            name, value = command[len("export "):].split("=", 1)
            env[name] = subprocess.run(["bash", "-c", f"printf %s {value}"], env=env, capture_output=True,
                                       text=True, check=True, timeout=60).stdout
        elif command.startswith("queueworker worker "):
            worker = subprocess.Popen(["bash", "-c", f"exec {command}"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
            try:
                wait_until(lambda: scalar(env["DATABASE_URL"], "SELECT count(*) FROM queueworker.tasks "
                                                               "WHERE state = 'succeeded'") == 100,
                           timeout=120, message="the 100 tasks the section enqueues")
                worker.send_signal(signal.SIGINT)  # Ctrl-C drains
                assert worker.wait(timeout=60) == 0, worker.stdout.read()
            finally:
                worker.kill()
        else:
            done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
            ran.append((command, done.stdout))
    status = dict(ran)["queueworker status"]
    assert "default" in status and "100" in status, status
    assert [command for command, _ in ran][-1] == "queueworker dev-db stop"

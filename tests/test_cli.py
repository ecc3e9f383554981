"""The `queueworker` CLI: real subprocesses, real database. Bad input means one line on stderr,
a non-zero exit (2 for usage errors), no traceback, and never a password in anything printed.

The large families of bad input, which never get past validation, run `cli.main` in this process
(`qw_here`: the same code from argument parsing to exit status, without a second of CPU to start
a process for each); one case of each kind also runs as a real process."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psycopg
import pytest
from hypothesis import example, given, settings, strategies as st

from queueworker import cli
from queueworker.dev.localpg import free_port
from queueworker.settings import SETTING_OPTIONS
from tests.support import WorkerProcess, query, scalar, wait_until

PASSWORD = "Hunter2-xyzzy"
# Nothing listens here: a command that got past validation would fail with exit 1 ("database
# error"), not the exit 2 and message the validation tests expect.
UNUSED_DSN = f"postgresql://nobody:{PASSWORD}@127.0.0.1:{free_port()}/x?connect_timeout=2"


def qw(*args: str, env: dict | None = None, stdin: bytes | None = None, timeout: float = 60,
       ) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("QUEUEWORKER_")}
    result = subprocess.run([sys.executable, "-m", "queueworker.cli", *args], capture_output=True, timeout=timeout,
                            input=stdin, env={**environ, **(env or {})})
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(errors="replace"),
                                       result.stderr.decode(errors="replace"))


def qw_here(monkeypatch: pytest.MonkeyPatch, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`qw` in this process: the same environment rules, stdout and stderr captured, argparse's exit
    taken as the exit status."""
    for key in [k for k in os.environ if k == "DATABASE_URL" or k.startswith("QUEUEWORKER_")]:
        monkeypatch.delenv(key)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = cli.main(list(args))
        except SystemExit as exc:  # argparse
            code = exc.code
    return subprocess.CompletedProcess(["queueworker", *args], code, stdout.getvalue(), stderr.getvalue())


def _one_clear_line(result: subprocess.CompletedProcess, code: int, fragment: str) -> None:
    assert result.returncode == code, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("queueworker: ") and fragment in lines[0], result.stderr


def _nested_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_no_database_configured():
    _one_clear_line(qw("status"), 2, "pass --dsn or set DATABASE_URL")


def test_unreachable_database_is_explained_without_the_password():
    result = qw("status", "--dsn", UNUSED_DSN)
    _one_clear_line(result, 1, "database error: connection to 127.0.0.1:")
    assert PASSWORD not in result.stdout + result.stderr


def test_invalid_json_payload():
    _one_clear_line(qw("enqueue", "qw.noop", "--payload", "{not json", "--dsn", UNUSED_DSN), 2, "not valid JSON")


def test_unknown_option():
    _one_clear_line(qw("worker", "--no-such-flag"), 2, "unrecognized arguments")


@pytest.mark.parametrize("args, fragment", [
    (["--delay", "inf"], "--delay: Input should be a finite number"),
    (["--delay", "nan"], "--delay: Input should be a finite number"),
    (["--delay", "1e308"], "--delay: Input should be less than or equal to 2147483647"),
    (["--delay", "-1"], "--delay: Input should be greater than or equal to 0"),
    (["--timeout", "2147483648"], "--timeout: Input should be less than or equal to 2147483647"),
    (["--timeout", "1.5"], "--timeout: Input should be a valid integer"),
    (["--priority", "2147483648"], "--priority: Input should be less than or equal to 2147483647"),
    (["--priority=-2147483649"], "--priority: Input should be greater than or equal to -2147483648"),
    (["--max-attempts", "9" * 30], "--max-attempts: Input should be less than or equal to 1000"),
    (["--max-attempts", "9" * 5000], "--max-attempts: "),
    (["--count", "0"], "must be from 1 to 1,000,000"),
    (["--count", "9" * 5000], "not a whole number"),
    (["--payload", '{"x": NaN}'], "payload cannot be stored: NaN and Infinity are not valid JSON"),
    (["--payload", "[1e999]"], "payload cannot be stored: NaN and Infinity are not valid JSON"),
    (["--payload", '{"x": "\\u0000"}'], "payload cannot be stored: a string contains a NUL character"),
    (["--payload", '"\\ud800"'], "payload cannot be stored: a string contains a lone UTF-16 surrogate"),
    (["--payload", "{}", "--payload-file", "x.json"], "not allowed with argument --payload"),
    (["--payload-file", "/no/such/file.json"], "cannot read --payload-file '/no/such/file.json': No such file"),
    (["--payload-file", "/"], "Is a directory"),
    (["--queue", "mail\n"], "--queue: String should match pattern"),
    (["--queue", "has space"], "--queue: String should match pattern"),
])
def test_hostile_enqueue_input_is_one_line_before_the_database(args, fragment, monkeypatch):
    _one_clear_line(qw_here(monkeypatch, "enqueue", "qw.noop", *args, "--dsn", UNUSED_DSN), 2, fragment)


@pytest.mark.parametrize("name", ["tab\there", "esc\x1b[31mred", "del\x7f", "line\nbreak", "sep\u2028", " "])
def test_task_names_must_be_printable(name, monkeypatch):
    _one_clear_line(qw_here(monkeypatch, "enqueue", name, "--dsn", UNUSED_DSN), 2, "TASK: must be printable text")



def test_payloads_too_deep_or_not_text_from_a_file_or_stdin_are_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_bytes(_nested_json(100_000))
    _one_clear_line(qw("enqueue", "qw.noop", "--payload-file", str(deep), "--dsn", UNUSED_DSN), 2,
                    "nested too deeply")
    _one_clear_line(qw("enqueue", "qw.noop", "--payload", "-", "--dsn", UNUSED_DSN, stdin=_nested_json(100_000)),
                    2, "the payload on stdin: nested too deeply")
    _one_clear_line(qw("enqueue", "qw.noop", "--payload", "-", "--dsn", UNUSED_DSN, stdin=b'"\xff"'), 2,
                    "the payload on stdin is not UTF-8 text")
    closed_stdin = subprocess.run([sys.executable, "-m", "queueworker.cli", "enqueue", "qw.noop", "--payload", "-",
                                   "--dsn", UNUSED_DSN], capture_output=True, text=True, timeout=60,
                                  preexec_fn=lambda: os.close(0))
    _one_clear_line(closed_stdin, 2, "cannot read the payload on stdin: stdin is closed")


@settings(max_examples=200, deadline=None)
@example(option="--payload", value="-", task="qw.noop")  # stdin, which pytest does not let anyone read
@given(option=st.sampled_from(["--delay", "--priority", "--timeout", "--max-attempts", "--count", "--queue",
                               "--payload"]),
       value=st.one_of(st.floats().map(repr), st.integers().map(str), st.text()),
       task=st.one_of(st.just("qw.noop"), st.text()))
def test_any_value_through_enqueue_is_one_line_never_a_traceback(option, value, task):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(["enqueue", "--dsn", UNUSED_DSN, f"{option}={value}", "--", task])
        except SystemExit as exc:  # argparse
            code = exc.code
    lines = stderr.getvalue().splitlines()
    assert code in (1, 2) and len(lines) == 1 and lines[0].startswith("queueworker: "), stderr.getvalue()
    assert PASSWORD not in stderr.getvalue()


BAD_URLS = [
    ("DATABASE_URL", "ghp_T0kenValue1234567890abcdef"),  # a token where the URL belongs
    ("--dsn", f"postgresql://app:{PASSWORD}@db.example/app?sslmod=require"),  # a typo in an option
    ("--dsn", f"postgres//app:{PASSWORD}@db.example/app"),  # a typo in the scheme
    ("--dsn", f"mysql://app:{PASSWORD}@db.example/app"),
    ("DATABASE_URL", f"host=db.example password={PASSWORD} port=fivefour"),
]


COMMANDS = [["migrate"], ["enqueue", "qw.noop"], ["worker"], ["status"], ["retry", "1"], ["cancel", "1"],
            ["demo", "--no-tty"]]


@pytest.mark.parametrize("command, source, url", [
    (command, source, url) for command in COMMANDS for source, url in BAD_URLS
    if not (command[0] == "demo" and source == "DATABASE_URL")  # the demo reads --dsn only
], ids=lambda value: value[0] if isinstance(value, list) else None)
def test_a_malformed_database_url_stops_every_command_at_once_without_echoing_it(command, source, url, monkeypatch):
    if source == "DATABASE_URL":
        result = qw_here(monkeypatch, *command, env={"DATABASE_URL": url})
    else:
        result = qw_here(monkeypatch, *command, "--dsn", url)
    _one_clear_line(result, 2, f"{source}: the database URL")
    secret = url if source == "DATABASE_URL" and "password" not in url else PASSWORD
    assert secret not in result.stdout + result.stderr


def test_hostile_input_is_one_line_from_a_real_process_too():
    _one_clear_line(qw("enqueue", "qw.noop", "--delay", "nan", "--dsn", UNUSED_DSN), 2,
                    "--delay: Input should be a finite number")
    _one_clear_line(qw("enqueue", "tab\there", "--dsn", UNUSED_DSN), 2, "TASK: must be printable text")
    _one_clear_line(qw("worker", "--dsn", UNUSED_DSN, env={"QUEUEWORKER_RETENTION_HOURS": "inf"}), 2,
                    "QUEUEWORKER_RETENTION_HOURS (as retention_seconds): Input")
    result = qw("status", env={"DATABASE_URL": BAD_URLS[0][1]})
    _one_clear_line(result, 2, "DATABASE_URL: the database URL")
    assert BAD_URLS[0][1] not in result.stdout + result.stderr


@pytest.mark.parametrize("args, env, fragment", [
    (["--task-timeout", "inf"], {}, "--task-timeout: Input should be a finite number"),
    (["--retention-hours", "inf"], {}, "--retention-hours (as retention_seconds): Input should be a finite number"),
    (["--retention-hours", "nan"], {}, "--retention-hours (as retention_seconds): Input should be a finite number"),
    (["--retention-hours", "1e308"], {}, "--retention-hours (as retention_seconds): Input should be a finite"),
    (["--lease-seconds", "nan"], {}, "--lease-seconds: Input should be a finite number"),
    (["--concurrency", "0"], {}, "--concurrency: Input should be greater than or equal to 1"),
    (["--heartbeat-seconds", "20"], {}, "heartbeat (20s) must be at most half the lease (30s)"),
    (["--queue", "ok", "--queue", "not ok"], {}, "--queue: String should match pattern"),
    (["--metrics-address", "no such host!"], {}, "--metrics-address: must be an IP address or a host name"),
    (["--command-env", "BAD-NAME"], {}, "--command-env: String should match pattern"),
    (["--log-level", "loud"], {}, "argument --log-level: invalid choice: 'loud'"),
    ([], {"QUEUEWORKER_CONCURRENCY": "many"}, "QUEUEWORKER_CONCURRENCY: Input should be a valid integer"),
    ([], {"QUEUEWORKER_RETENTION_HOURS": "inf"}, "QUEUEWORKER_RETENTION_HOURS (as retention_seconds): Input"),
    ([], {"QUEUEWORKER_QUEUES": "mail,not ok"}, "QUEUEWORKER_QUEUES: String should match pattern"),
    ([], {"QUEUEWORKER_LOG_LEVEL": "loud"}, "QUEUEWORKER_LOG_LEVEL: must be one of debug, info"),
    ([], {"QUEUEWORKER_LOG_FORMAT": "xml"}, "QUEUEWORKER_LOG_FORMAT: must be one of json, text"),
    (["--concurrency", "0"], {"QUEUEWORKER_CONCURRENCY": "5"}, "--concurrency: Input should be greater"),
])
def test_a_bad_worker_setting_is_one_line_naming_its_flag_or_variable(args, env, fragment, monkeypatch):
    _one_clear_line(qw_here(monkeypatch, "worker", *args, "--dsn", UNUSED_DSN, env=env), 2, fragment)


@pytest.mark.parametrize("args, fragment", [
    (["--processes", "2", "--metrics-port", "65535"], "--metrics-port 65535 with 2 processes needs ports 65535-65536"),
    (["--processes", "64", "--metrics-port", "65500"], "use a port of at most 65472"),
])
def test_worker_processes_need_a_metrics_port_for_each(args, fragment, monkeypatch):
    _one_clear_line(qw_here(monkeypatch, "worker", *args, "--dsn", UNUSED_DSN), 2, fragment)


def test_worker_help_shows_every_setting_with_the_models_default_and_its_variable():
    result = qw("worker", "--help", env={"COLUMNS": "400"})
    text = " ".join(result.stdout.split())
    for option in SETTING_OPTIONS:
        assert f"{option.flag} " in text and f"${option.env})" in text
        if option.default_text is not None:
            assert f"(default: {option.default_text}; ${option.env})" in text, option


def test_the_readme_names_every_worker_setting():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme[readme.index("**Worker settings.**"):readme.index("## Queue semantics")]
    assert [option.flag for option in SETTING_OPTIONS if f"`{option.flag}" not in section] == []


def test_the_readmes_command_table_names_every_command():
    from queueworker.cli import COMMANDS

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `queueworker ")]
    missing = [name for name, *_ in COMMANDS
               if not any(f"`queueworker {name}" in row or f"/ `{name}" in row for row in rows)]
    assert missing == []


def test_metrics_are_served_on_the_configured_address_only():
    port = free_port()
    worker = WorkerProcess(UNUSED_DSN, "--metrics-port", str(port), "--metrics-address", "127.0.0.2")
    try:
        body = wait_until(lambda: _get(f"http://127.0.0.2:{port}/metrics"), message="metrics on 127.0.0.2")
        assert "queueworker_worker_state" in body
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        worker.stop()
    assert PASSWORD not in worker.log()


def test_a_metrics_port_in_use_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = qw("worker", "--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--dsn", UNUSED_DSN)
    _one_clear_line(result, 2, f"cannot serve metrics on 127.0.0.1 port {port}: Address already in use")


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()
    except OSError:
        return None


@pytest.mark.integration
def test_invalid_values_are_rejected_before_anything_runs(dsn):
    _one_clear_line(qw("enqueue", "qw.noop", "--queue", "bad queue", "--dsn", dsn), 2, "queue")
    _one_clear_line(qw("worker", "--lease-seconds", "4", "--heartbeat-seconds", "3", "--dsn", dsn), 2,
                    "at most half the lease")
    _one_clear_line(qw("worker", "--handlers", "no_such_module_xyz", "--dsn", dsn), 2,
                    "cannot import handler module 'no_such_module_xyz'")
    assert query(dsn, "SELECT count(*) FROM queueworker.tasks") == [(0,)]


@pytest.mark.integration
def test_worker_settings_come_from_flags_over_variables_and_heartbeat_follows_the_lease(dsn):
    env = {"QUEUEWORKER_CONCURRENCY": "3", "QUEUEWORKER_QUEUES": "mail,sms", "QUEUEWORKER_LEASE_SECONDS": "nan"}
    worker = WorkerProcess(dsn, "--concurrency", "4", "--lease-seconds", "10", env=env)
    try:
        wait_until(lambda: query(dsn, "SELECT count(*) FROM queueworker.workers")[0][0] == 1, message="registered")
        assert query(dsn, "SELECT concurrency, queues FROM queueworker.workers") == [(4, ["mail", "sms"])]
        result = qw("enqueue", "qw.sleep", "--payload", '{"seconds": 30}', "--queue", "sms", "-q", "--dsn", dsn)
        task_id = int(result.stdout)
        wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task_id,))
                   == "running", message="task claimed")
        lease_left = scalar(dsn, "SELECT extract(epoch FROM leased_until - now()) FROM queueworker.tasks "
                                 "WHERE id = %s", (task_id,))
        assert 0 < lease_left <= 10
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.log()
        worker.stop()
    assert "Traceback" not in worker.log()


@pytest.mark.integration
def test_large_payloads_come_from_stdin_or_a_file(dsn, tmp_path):
    payload = {"rows": [{"n": n, "text": "é" * 20} for n in range(20_000)]}  # ~1 MB, past a command line's limit
    data = json.dumps(payload).encode()
    from_stdin = qw("enqueue", "qw.noop", "-q", "--payload", "-", "--dsn", dsn, stdin=data)
    (tmp_path / "payload.json").write_bytes(data)
    from_file = qw("enqueue", "qw.noop", "-q", "--payload-file", str(tmp_path / "payload.json"), "--dsn", dsn)
    ids = [int(from_stdin.stdout), int(from_file.stdout)]
    stored = query(dsn, "SELECT payload FROM queueworker.tasks WHERE id = ANY(%s)", (ids,))
    assert stored == [(payload,), (payload,)]


@pytest.mark.integration
def test_enqueue_status_cancel_retry_roundtrip(dsn):
    result = qw("enqueue", "qw.sleep", "--payload", '{"seconds": 1}', "--queue", "mail", "--count", "3",
                "--dsn", dsn)
    assert result.returncode == 0 and "enqueued 3 tasks" in result.stdout
    task_id = query(dsn, "SELECT min(id) FROM queueworker.tasks")[0][0]

    assert qw("cancel", str(task_id), "--dsn", dsn).returncode == 0
    _one_clear_line(qw("cancel", str(task_id), "--dsn", dsn), 2, "is cancelled")
    _one_clear_line(qw("retry", "999999", "--dsn", dsn), 2, "no task with id 999999")
    retried = qw("retry", str(task_id), "--dsn", dsn)
    assert retried.returncode == 0 and "pending again" in retried.stdout

    report = json.loads(qw("status", "--json", "--dsn", dsn).stdout)
    assert report["queues"]["mail"]["pending"] == 3
    text = qw("status", "--dsn", dsn, "--queue", "mail").stdout
    assert "mail" in text and "(no live workers)" in text


@pytest.mark.integration
def test_migrate_is_idempotent(dsn):
    result = qw("migrate", "--dsn", dsn)
    assert result.returncode == 0 and "nothing to apply" in result.stdout


@pytest.mark.integration
def test_worker_refuses_an_unmigrated_database_until_told_to_migrate(blank_dsn):
    proc = subprocess.Popen([sys.executable, "-m", "queueworker.cli", "worker", "--dsn", blank_dsn,
                             "--log-format", "text"], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        while "cannot start" not in line:
            line = proc.stderr.readline()
        assert "run `queueworker migrate`" in line
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
    proc = subprocess.Popen([sys.executable, "-m", "queueworker.cli", "worker", "--dsn", blank_dsn, "--migrate"],
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: query(blank_dsn, "SELECT to_regclass('queueworker.workers') IS NOT NULL")[0][0]
                   and query(blank_dsn, "SELECT count(*) FROM queueworker.workers")[0][0] == 1,
                   message="worker migrated and registered")
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


# -- no secret in anything a real process prints ------------------------------------------------

PROBE_ROLE = "qw_password_probe"

LEAKY_HANDLERS = '''
import logging, os
from queueworker import task

url = os.environ["DATABASE_URL"]
logging.getLogger("leaky").warning("handlers loaded for %s", url, extra={"dsn": url, "nested": {"urls": [url]}})


@task(name="leaky")
def leaky(payload, ctx):
    try:
        raise ConnectionError(f"could not reach {url}")
    except ConnectionError:
        ctx.logger.exception("leaky failed with %s", url)
        raise
'''


def _url(dsn: str, user: str, password: str, port: int | None = None) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return f"postgresql://{user}:{password}@{params['host']}:{port or params['port']}/{params['dbname']}"


@pytest.fixture
def password_role(local_postgres, dsn):
    """A role that must give its password (scram), on the session's server; removed afterwards."""
    hba = local_postgres.data_dir / "pg_hba.conf"
    original = hba.read_text()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {PROBE_ROLE} LOGIN PASSWORD 'the-right-one'")
        hba.write_text(f"host all {PROBE_ROLE} 127.0.0.1/32 scram-sha-256\n" + original)
        conn.execute("SELECT pg_reload_conf()")
        try:
            yield PROBE_ROLE
        finally:
            hba.write_text(original)
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"DROP ROLE {PROBE_ROLE}")


@pytest.mark.integration
@pytest.mark.parametrize("failure", ["wrong password", "unreachable port"])
def test_a_worker_that_cannot_connect_logs_and_prints_no_password(dsn, password_role, failure):
    url = (_url(dsn, password_role, PASSWORD) if failure == "wrong password"
           else _url(dsn, password_role, PASSWORD, port=free_port()))
    status = qw("status", env={"DATABASE_URL": url})
    expected = (f'password authentication failed for user "{password_role}"' if failure == "wrong password"
                else "refused")
    _one_clear_line(status, 1, expected)
    worker = WorkerProcess(url, "--log-format", "json")
    try:
        wait_until(lambda: worker.log().count("cannot start") >= 2, message="two failed connection attempts")
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        worker.stop()
    output = worker.log() + status.stdout + status.stderr
    assert PASSWORD not in output and expected in output


@pytest.fixture
def leaky_role(dsn):
    """A superuser whose password is PASSWORD, so the worker's URL carries that password."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE qw_leaky LOGIN SUPERUSER PASSWORD '{PASSWORD}'")
        try:
            yield "qw_leaky"
        finally:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'qw_leaky'")
            conn.execute("DROP ROLE qw_leaky")


@pytest.mark.integration
@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_worker_never_logs_its_password_whoever_writes_it(dsn, tmp_path, log_format, leaky_role):
    (tmp_path / "leaky_handlers.py").write_text(LEAKY_HANDLERS)
    url = _url(dsn, leaky_role, PASSWORD)
    with psycopg.connect(url) as conn:
        task_id = conn.execute("INSERT INTO queueworker.tasks (queue, task, max_attempts) "
                               "VALUES ('default', 'leaky', 1) RETURNING id").fetchone()[0]
    worker = subprocess.Popen(
        [sys.executable, "-m", "queueworker.cli", "worker", "--handlers", "leaky_handlers", "--log-format", log_format],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "DATABASE_URL": url, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    try:
        wait_until(lambda: scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task_id,))
                   == "failed", message="the leaky task failed")
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=30)[0].decode(errors="replace")
    assert worker.returncode == 0, output
    # The configured URL is masked whole wherever it appears literally.
    assert "handlers loaded for ***" in output and "leaky failed with ***" in output
    assert "ConnectionError: could not reach ***" in output
    assert PASSWORD not in output


@pytest.mark.integration
def test_status_counts_each_workers_running_tasks_now_and_fits_80_columns(dsn):
    """The per-worker running count comes from the leases held, not from the worker's last
    heartbeat (10 s apart here): it agrees with the queue's count as soon as the tasks run."""
    worker = WorkerProcess(dsn, "--concurrency", "4", "--lease-seconds", "30", "--heartbeat-seconds", "10",
                           "--queue", "a-queue-with-a-rather-long-descriptive-name")
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.workers"), message="worker registered")
        qw("enqueue", "qw.sleep", "--payload", '{"seconds": 20}', "--count", "3",
           "--queue", "a-queue-with-a-rather-long-descriptive-name", "--dsn", dsn)
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'running'") == 3,
                   message="three tasks running")
        report = json.loads(qw("status", "--json", "--dsn", dsn).stdout)
        assert [w["running"] for w in report["workers"]] == [3]
        assert report["queues"]["a-queue-with-a-rather-long-descriptive-name"]["running"] == 3
        text = qw("status", "--dsn", dsn).stdout
        assert max(len(line) for line in text.splitlines()) <= 80, text
        assert f"pid {worker.pid}" in text and "3/4" in text  # a local worker: its host and process
    finally:
        worker.stop()


@pytest.mark.integration
@pytest.mark.parametrize("command", [["status"], ["enqueue", "qw.noop"], ["list"], ["show", "1"]])
def test_commands_before_migrate_say_to_run_migrate_first(blank_dsn, command):
    _one_clear_line(qw(*command, "--dsn", blank_dsn), 1, "run `queueworker migrate` first")


def test_every_subcommand_has_a_description_and_help_shows_defaults():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, subparser in commands.choices.items():
        assert subparser.description, name
    text = commands.choices["enqueue"].format_help()
    assert "(default: 1)" in text and "(default: default)" in text and "(default: 10)" in text
    assert "(default: 0)" in commands.choices["demo"].format_help()

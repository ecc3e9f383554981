"""The web console against a real Postgres (Starlette's TestClient): every page, filters and
paging, lookups, authentication, the CSRF checks, the actions, secrets and hostile payloads."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from urllib.parse import parse_qs, urljoin, urlsplit

import psycopg
import pytest
from starlette.testclient import TestClient

from queueworker import cli, enqueue_many
from queueworker.console import ConsoleConfig, CredentialsError, create_app, load_token
from queueworker.console import data
from queueworker.console.auth import allowed_hosts
from queueworker.dsn import parse
from queueworker.dev.localpg import free_port
from tests import console_data
from tests.support import query, scalar, wait_until

pytestmark = pytest.mark.integration

TOKEN = "console-token-0123456789abcdef"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def demo(dsn):
    return console_data.fill(dsn)


def client(dsn, **options) -> TestClient:
    options.setdefault("allowed_hosts", allowed_hosts(("console.test",)))
    return TestClient(create_app(ConsoleConfig(dsn, **options)), base_url="http://console.test",
                      follow_redirects=False)


def csrf_token(page_html: str) -> str:
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', page_html)[1]


def ids_in(page_html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<td><a href="/tasks/(\d+)">', page_html)]


def test_every_page_renders_what_the_database_holds(dsn, demo):
    with client(dsn) as c:
        queues = c.get("/queues").text
        assert all(f'href="/tasks?queue={q}"' in queues for q in ("emails", "reports", "billing"))
        assert "paused" in queues and "rate 5/s (burst 5); at most 4 running" in queues
        assert ids_in(c.get("/tasks").text)[:3] == sorted(ids_in(c.get("/tasks").text), reverse=True)[:3]
        task = c.get(f"/tasks/{demo.failed[0]}").text
        assert "550 mailbox unavailable" in task and "SMTPRecipientsRefused" in task
        assert task.count("<tr><td>") >= 3, "enqueued, running and failed in the audit trail"
        assert "running</td><td>failed" in task
        workers = c.get("/workers").text
        assert "emails-worker-7c9f4-2xkqp" in workers and "billing-worker-5d8b6-9wz4r" in workers
        assert f'<a href="/tasks/{demo.running[0]}">' in workers, "the leases the worker holds"
        runs = c.get("/runs").text
        assert f'<a href="/runs/{demo.run_id}">' in runs and "nightly-export" in runs
        run = c.get(f"/runs/{demo.run_id}").text
        assert run.count('<tr><td><a href="/tasks/') == 3
        assert c.get("/").headers["location"] == "/queues"
        assert c.get("/tasks/999999").status_code == 404
        assert c.get("/runs/999999").status_code == 404


def test_task_filters_and_lookups(dsn, demo):
    with client(dsn) as c:
        assert sorted(ids_in(c.get("/tasks?state=failed").text)) == demo.failed
        assert sorted(ids_in(c.get("/tasks?state=running").text)) == demo.running
        assert set(ids_in(c.get("/tasks?queue=billing").text)) == {*demo.pending, demo.keyed}
        assert ids_in(c.get("/tasks?queue=emails&state=succeeded&task=send_welcome_email").text) == \
            sorted(demo.succeeded, reverse=True)
        found = c.get("/tasks?key=invoice-2026-11").text
        assert ids_in(found) == [demo.keyed] and "Unfinished task holding this key" in found
        assert c.get(f"/tasks?id={demo.keyed}").headers["location"] == f"/tasks/{demo.keyed}"
        for bad in ("/tasks?state=lost", "/tasks?queue=no%20spaces", "/tasks?id=-1", "/tasks?id=99999999999999999999",
                    "/tasks?key=%00", "/tasks?before=x", "/runs?name=a%00b", "/tasks/1e3"):
            response = c.get(bad)
            assert response.status_code in (400, 404), bad
            assert 'class="error"' in response.text


def test_paging_follows_the_keyset_below_each_scan(dsn, monkeypatch):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [{"task": "t", "queue": "busy"} for _ in range(130)])
        rare = enqueue_many(conn, [{"task": "t", "queue": "rare"} for _ in range(3)])
        enqueue_many(conn, [{"task": "t", "queue": "busy"} for _ in range(40)])
    everything = [r[0] for r in query(dsn, "SELECT id FROM queueworker.tasks ORDER BY id DESC")]
    monkeypatch.setattr(data, "SCAN_BUDGET", 25)
    monkeypatch.setattr(data, "PAGE_SIZE", 20)
    with client(dsn) as c:
        def walk(path: str) -> list[int]:
            seen: list[int] = []
            for _ in range(50):
                page = c.get(path).text
                seen += ids_in(page)
                link = re.search(r'<a id="next" href="([^"]+)"', page)
                if not link:
                    return seen
                path = link[1].replace("&amp;", "&")
                assert parse_qs(urlsplit(path).query)["before"]
            raise AssertionError("paging did not end")

        assert walk("/tasks") == everything
        assert walk("/tasks?queue=rare") == sorted(rare, reverse=True), "found below several scans with no match"


def test_no_token_means_open_and_read_only(dsn, demo):
    with client(dsn) as c:
        page = c.get(f"/tasks/{demo.failed[0]}").text
        assert "csrf_token" not in page and "Retry" not in page
        refused = c.post(f"/tasks/{demo.failed[0]}/retry", data={"csrf_token": "x"})
        assert refused.status_code == 403 and "without --allow-actions" in refused.text
        refused = c.post("/queues/billing/resume", data={})
        assert refused.status_code == 403
    assert scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (demo.failed[0],)) == "failed"
    assert scalar(dsn, "SELECT paused_until IS NOT NULL FROM queueworker.queues WHERE name = 'billing'")


def test_a_token_guards_every_page(dsn, demo):
    with client(dsn, token=TOKEN) as c:
        for path in ("/queues", "/tasks", f"/tasks/{demo.keyed}", "/workers", "/runs", "/keys", "/scaling",
                     "/static/console.css"):
            refused = c.get(path)
            assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic"), path
        wrong = base64.b64encode(b"admin:not-the-token-at-all").decode()
        assert c.get("/queues", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
        assert c.get("/queues", headers={"Authorization": "Bearer " + TOKEN[:-1]}).status_code == 401
        assert c.get("/queues", headers={"Authorization": "Basic %%%"}).status_code == 401
        assert c.get("/queues", headers=BEARER).status_code == 200
        basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
        assert c.get("/queues", headers={"Authorization": f"Basic {basic}"}).status_code == 200
        assert c.get("/healthz").status_code == 200


def test_allow_actions_needs_a_usable_token(dsn, tmp_path, monkeypatch, capsys):
    with pytest.raises(CredentialsError, match="--allow-actions needs credentials"):
        ConsoleConfig(dsn, allow_actions=True)
    monkeypatch.delenv("QUEUEWORKER_CONSOLE_TOKEN", raising=False)
    monkeypatch.delenv("QUEUEWORKER_CONSOLE_TOKEN_FILE", raising=False)
    monkeypatch.setenv("DATABASE_URL", dsn)
    assert cli.main(["console", "--allow-actions", "--port", "1"]) == cli.EXIT_USAGE
    assert "--allow-actions needs credentials" in capsys.readouterr().err
    short = tmp_path / "short"
    short.write_text("tiny\n")
    assert cli.main(["console", "--allow-actions", "--token-file", str(short)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "16 to 4096 characters" in err and "tiny" not in err
    assert cli.main(["console", "--token-file", str(tmp_path / "missing")]) == cli.EXIT_USAGE
    assert "cannot read the token file" in capsys.readouterr().err
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")  # a Secret's trailing newline is not part of the token
    assert load_token(str(secret)) == TOKEN
    assert load_token(environ={"QUEUEWORKER_CONSOLE_TOKEN": TOKEN}) == TOKEN
    assert load_token(environ={}) is None


def test_forms_need_same_origin_and_the_signed_token(dsn, demo):
    task = demo.failed[0]
    with client(dsn, token=TOKEN, allow_actions=True) as c:
        page = c.get(f"/tasks/{task}", headers=BEARER)
        token = csrf_token(page.text)
        cookie = page.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        path = f"/tasks/{task}/retry"
        assert c.post(path, data={"csrf_token": token}).status_code == 401, "no credentials"
        refusals = [
            c.post(path, data={}, headers=BEARER),
            c.post(path, data={"csrf_token": "0" * 64}, headers=BEARER),
            c.post(path, data={"csrf_token": token}, headers={**BEARER, "Origin": "http://evil.example"}),
            c.post(path, data={"csrf_token": token}, headers={**BEARER, "Origin": "null"}),
            c.post(path, data={"csrf_token": token}, headers={**BEARER, "Referer": "http://evil.example/x"}),
        ]
        assert [r.status_code for r in refusals] == [403] * 5
        assert "another site" in refusals[2].text
        stranger = client(dsn, token=TOKEN, allow_actions=True)  # another browser: its own cookie
        with stranger:
            assert stranger.post(path, data={"csrf_token": token}, headers=BEARER).status_code == 403
        assert scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task,)) == "failed"
        done = c.post(path, data={"csrf_token": token}, headers={**BEARER, "Origin": "http://console.test"})
        assert done.status_code == 303 and done.headers["location"] == f"/tasks/{task}?done=retried"
        assert "The task is pending again." in c.get(done.headers["location"], headers=BEARER).text
    assert scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task,)) == "pending"
    assert query(dsn, "SELECT from_state::text, to_state::text FROM queueworker.task_events WHERE task_id = %s "
                      "ORDER BY id DESC LIMIT 1", (task,)) == [("failed", "pending")]


def test_actions_cancel_pause_resume_and_their_refusals(dsn, demo):
    with client(dsn, token=TOKEN, allow_actions=True) as c:
        token = csrf_token(c.get("/queues", headers=BEARER).text)

        def post(path: str):
            return c.post(path, data={"csrf_token": token}, headers=BEARER)

        assert post(f"/tasks/{demo.pending[0]}/cancel").status_code == 303
        assert post("/queues/billing/resume").headers["location"] == "/queues?done=resumed"
        assert post("/queues/emails/pause").status_code == 303
        refused = post(f"/tasks/{demo.succeeded[0]}/retry")
        assert refused.status_code == 409 and "only failed or cancelled tasks" in refused.text
        assert post(f"/tasks/{demo.succeeded[0]}/cancel").status_code == 409
        assert post("/queues/never-configured/resume").status_code == 409
        assert post("/tasks/1/explode").status_code == 404
        assert post("/queues/bad%20name/pause").status_code == 400
        key_held = post(f"/tasks/{demo.pending[0]}/retry")  # cancelled: retryable, its key is free
        assert key_held.status_code == 303
    assert scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (demo.pending[0],)) == "pending"
    assert query(dsn, "SELECT name, paused_until IS NOT NULL FROM queueworker.queues "
                      "WHERE name IN ('billing', 'emails') ORDER BY name") == [("billing", False), ("emails", True)]
    assert query(dsn, "SELECT from_state::text, to_state::text FROM queueworker.task_events WHERE task_id = %s "
                      "ORDER BY id", (demo.pending[0],)) == [(None, "pending"), ("pending", "cancelled"),
                                                           ("cancelled", "pending")]


def test_no_page_shows_the_database_url_or_its_password(dsn, demo):
    password = parse(dsn)["password"]
    assert password
    pages = ["/queues", "/tasks", f"/tasks/{demo.failed[0]}", "/workers", "/runs", f"/runs/{demo.run_id}", "/scaling",
             "/tasks?state=bogus"]
    with client(dsn, token=TOKEN) as c:
        for path in pages:
            text = c.get(path, headers=BEARER).text
            assert password not in text and dsn not in text and TOKEN not in text, path
    broken = dsn.replace(password, password + "-wrong")
    with client(broken) as c:
        failed = c.get("/queues")
    assert failed.status_code == 503 and "password authentication failed" in failed.text
    assert password not in failed.text and broken not in failed.text


def test_hostile_payloads_are_escaped_cut_and_shown_raw(dsn, demo):
    with client(dsn) as c:
        hostile = c.get(f"/tasks/{demo.hostile}").text
        assert "<script>" not in hostile and "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in hostile
        assert "\\u001b[31m" in hostile, "control characters shown as JSON escapes"
        huge = c.get(f"/tasks/{demo.huge}")
        assert huge.status_code == 200 and len(huge.text) < 100_000
        stored = len('{"blob": ""}') + 300_000  # jsonb's text form
        assert f"Truncated, {stored} bytes: the first {data.JSON_SHOWN_CHARS} characters are shown" in huge.text
        deep = c.get(f"/tasks/{demo.deep}")
        assert deep.status_code == 200 and "[" * 100 in deep.text, "too deep for Python: shown as stored"
        for path in ("/tasks?queue=%3Cscript%3E", "/tasks?task=%3Cscript%3Ealert(1)%3C/script%3E"):
            page = c.get(path).text
            assert "<script>alert(1)" not in page and "<script>" not in page
        headers = c.get("/queues").headers
        assert "default-src 'none'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff"


def test_scaling_page_says_when_the_cluster_cannot_be_read(dsn, tmp_path):
    with client(dsn) as c:
        page = c.get("/scaling").text
    assert 'id="unavailable"' in page and "no cluster access: the in-cluster configuration cannot be used" in page
    bad = tmp_path / "kubeconfig"
    bad.write_text("not: [a kubeconfig")
    with client(dsn, kubeconfig=str(bad)) as c:
        page = c.get("/scaling").text
    assert "no cluster access" in page and str(bad) in page


def test_the_cli_serves_the_console_and_logs_no_secret(dsn, demo, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    port = free_port()
    env = {**os.environ, "DATABASE_URL": dsn}
    env.pop("QUEUEWORKER_CONSOLE_TOKEN", None)
    log = tmp_path / "console.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "queueworker.cli", "console", "--port", str(port),
                                    "--allow-actions", "--token-file", str(token_file)],
                                   env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            def get(path: str, **headers: str) -> tuple[int, str]:
                request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        return response.status, response.read().decode()
                except urllib.error.HTTPError as exc:
                    return exc.code, exc.read().decode()

            wait_until(lambda: _answers(get), timeout=60, message="the console answers")
            assert get("/queues")[0] == 401
            status, page = get(f"/tasks/{demo.failed[0]}", Authorization=f"Bearer {TOKEN}")
            assert status == 200 and "550 mailbox unavailable" in page and 'name="csrf_token"' in page
        finally:
            process.terminate()
            process.wait(timeout=30)
    logged = log.read_text()
    assert "GET /tasks/" in logged, "the access log is written"
    assert parse(dsn)["password"] not in logged and TOKEN not in logged


def _answers(get) -> bool:
    try:
        return get("/healthz")[0] == 200
    except OSError:
        return False


def test_a_host_the_console_does_not_serve_gets_no_content(dsn, demo):
    """DNS rebinding: a page fetched through evil.example (resolving to the console's address) is
    refused before anything is read; the names the console serves still work."""
    with client(dsn) as c:
        for host in ("evil.example", "evil.example:8080", "console.test.evil.example", "127.0.0.1.nip.io", "",
                     "console.test:80:80"):
            refused = c.get(f"/tasks/{demo.failed[0]}", headers={"Host": host})
            assert refused.status_code == 400, host
            assert refused.text.count("\n") == 1 and "Host header" in refused.text
            assert "550 mailbox unavailable" not in refused.text and "set-cookie" not in refused.headers
            assert "default-src 'none'" in refused.headers["content-security-policy"]
        # A name given, localhost, and IP addresses (which rebinding, needing a name, cannot produce).
        for host in ("console.test", "CONSOLE.test:8080", "console.test.", "localhost:8080", "127.0.0.1:8080",
                     "10.1.2.3", "[::1]:8080"):
            assert "550 mailbox unavailable" in c.get(f"/tasks/{demo.failed[0]}", headers={"Host": host}).text, host
    with client(dsn, allowed_hosts=frozenset()) as c:
        assert c.get("/queues").status_code == 400, "console.test is served only when given"
        assert c.get("/healthz").status_code == 200, "probes name no host"
    assert allowed_hosts(("Console.Example.", "10.0.0.5", "[::1]")) == {"console.example"}
    for bad in ("console.example:443", "http://console.example", "a b", ""):
        with pytest.raises(ValueError, match="--allowed-host takes a host name"):
            allowed_hosts((bad,))


def test_the_form_cookie_is_secure_when_asked_or_over_tls(dsn):
    def cookie(c: TestClient, **headers: str) -> str:
        c.cookies.clear()  # a browser without the cookie yet: the response sets it
        return c.get("/queues", headers=headers).headers["set-cookie"]

    with client(dsn) as c:
        assert "secure" not in cookie(c).lower()
        assert "secure" not in cookie(c, **{"X-Forwarded-Proto": "https"}).lower(), "any client can send it"
    with client(dsn, secure_cookies=True) as c:
        assert "; secure" in cookie(c).lower()
    tls = TestClient(create_app(ConsoleConfig(dsn, allowed_hosts=allowed_hosts(("console.test",)))),
                     base_url="https://console.test")
    with tls:
        assert "; secure" in cookie(tls).lower()


def test_an_unexpected_error_keeps_the_security_headers(dsn):
    app = create_app(ConsoleConfig(dsn, allowed_hosts=allowed_hosts(("console.test",))))

    def broken() -> None:
        raise RuntimeError(f"a bug holding {dsn}")

    app.state.console.db.queues = broken
    with TestClient(app, base_url="http://console.test", raise_server_exceptions=False) as c:
        failed = c.get("/queues")
    assert failed.status_code == 500 and failed.text == "internal error: the console's log says what went wrong\n"
    assert "default-src 'none'" in failed.headers["content-security-policy"]
    assert failed.headers["x-content-type-options"] == "nosniff" and failed.headers["cache-control"] == "no-store"


def test_a_queue_name_cannot_address_another_queue(dsn):
    """`evil/../q2` cannot be stored (migration 014), and a form for a name stored before that
    (simulated by lifting the check) posts to a path that is not q2's."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in ("INSERT INTO queueworker.queues (name) VALUES ('evil/../q2')",
                          "INSERT INTO queueworker.cron_jobs (name, expression, task, queue, source, next_slot) "
                          "VALUES ('c', '* * * * *', 't', 'evil/../q2', 'runtime', now())",
                          "INSERT INTO queueworker.workers (id, hostname, pid, queues, concurrency, version) "
                          "VALUES (gen_random_uuid(), 'h', 1, '{ok,evil/../q2}', 1, '0')"):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(statement)
        conn.execute("ALTER TABLE queueworker.queues DROP CONSTRAINT queues_name_pattern")
        conn.execute("ALTER TABLE queueworker.queue_events DROP CONSTRAINT queue_events_queue_pattern")
        conn.execute("INSERT INTO queueworker.queues (name, paused_until) VALUES ('evil/../q2', 'infinity'), "
                     "('q2', 'infinity')")
    with client(dsn, token=TOKEN, allow_actions=True) as c:
        page = c.get("/queues", headers=BEARER).text
        actions = re.findall(r'<form class="inline" method="post" action="([^"]+)"', page)
        assert "/queues/evil%2F..%2Fq2/resume" in actions
        token = csrf_token(page)
        for action in actions:
            if "evil" in action:  # where a browser sends the form: the path as the link resolves
                target = urljoin("http://console.test/queues", action)
                assert urlsplit(target).path == "/queues/evil%2F..%2Fq2/resume"
                refused = c.post(target, data={"csrf_token": token}, headers=BEARER)
                assert refused.status_code in (404, 405)
    assert query(dsn, "SELECT name FROM queueworker.queues WHERE paused_until IS NOT NULL ORDER BY name") == [
        ("evil/../q2",), ("q2",)]


def test_a_runs_page_shows_its_first_events(dsn, demo, monkeypatch):
    """The run page reads a bounded audit trail however often the run moved (`run show` reads all)."""
    from queueworker.client import runs as client_runs

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queueworker.run_events (run_id, from_state, to_state, detail) "
                     "SELECT %s, 'running', 'running', '{}' FROM generate_series(1, 50)", (demo.run_id,))
        assert len(client_runs.run_events(conn, demo.run_id)) == 51
    monkeypatch.setattr(data, "RUN_EVENTS_SHOWN", 10)
    with client(dsn) as c:
        page = c.get(f"/runs/{demo.run_id}").text
    events = page[page.index('<table id="run-events">'):]
    assert events[:events.index("</table>")].count("<tr><td>") == 10 and "The first 10 events are shown." in page

"""The console in a real browser: headless Chromium against the console served over HTTP, on a real
Postgres. Navigation across the pages, filtering tasks, a retry through the form (authenticated),
and the refusal of a browser without credentials.

Needs Debian's chromium and chromium-driver (.ci/run installs them); without them the tests skip,
or fail in CI (CI=true or QUEUEWORKER_REQUIRE_CLUSTER=1)."""

from __future__ import annotations

import base64
import os

import psycopg
import pytest

from queueworker.console import ConsoleConfig
from tests import console_data
from tests.console_browser import chromium, document_statuses, missing_browser, serve
from tests.support import scalar, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.browser]

TOKEN = "browser-token-0123456789abcdef"


@pytest.fixture(scope="module")
def browser_available():
    reason = missing_browser()
    if reason:
        required = os.environ.get("QUEUEWORKER_REQUIRE_CLUSTER") == "1" or os.environ.get("CI") == "true"
        pytest.fail(reason, pytrace=False) if required else pytest.skip(reason)


@pytest.fixture
def console(dsn, browser_available):
    demo = console_data.fill(dsn)
    with serve(ConsoleConfig(dsn, token=TOKEN, allow_actions=True)) as url:
        yield url, demo


def rows(driver, table_id: str) -> list[list[str]]:
    from selenium.webdriver.common.by import By

    table = driver.find_element(By.ID, table_id)
    return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in table.find_elements(By.TAG_NAME, "tr")[1:]]


def test_navigate_filter_and_retry_in_a_real_browser(console, dsn):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url, demo = console
    with chromium(authorization=f"Bearer {TOKEN}") as driver:
        driver.get(url + "/")
        assert driver.current_url == url + "/queues" and driver.title.startswith("Queues")
        assert sorted(row[0] for row in rows(driver, "queues")) == ["billing", "emails", "reports"]

        driver.find_element(By.LINK_TEXT, "Workers").click()
        assert any("emails-worker-7c9f4-2xkqp" in row[0] for row in rows(driver, "workers"))
        driver.find_element(By.LINK_TEXT, "Runs").click()
        driver.find_element(By.LINK_TEXT, str(demo.run_id)).click()
        assert driver.title.startswith(f"Run {demo.run_id}") and len(rows(driver, "run-tasks")) == 3
        driver.find_element(By.LINK_TEXT, "Scaling").click()
        assert "no cluster access" in driver.find_element(By.ID, "unavailable").text

        driver.find_element(By.LINK_TEXT, "Tasks").click()
        filters = driver.find_element(By.ID, "filters")
        filters.find_element(By.NAME, "queue").send_keys("emails")
        Select(filters.find_element(By.NAME, "state")).select_by_visible_text("failed")
        filters.find_element(By.TAG_NAME, "button").click()
        wait_until(lambda: "state=failed" in driver.current_url, timeout=60)
        listed = rows(driver, "tasks")
        assert sorted(int(row[0]) for row in listed) == demo.failed
        assert {row[3] for row in listed} == {"failed"}

        task = demo.failed[0]
        driver.find_element(By.LINK_TEXT, str(task)).click()
        assert driver.find_element(By.ID, "state").text == "failed"
        assert "550 mailbox unavailable" in driver.find_element(By.ID, "error-json").text
        driver.find_element(By.XPATH, "//button[text()='Retry']").click()
        wait_until(lambda: "done=retried" in driver.current_url, timeout=60)
        assert driver.find_element(By.ID, "notice").text == "The task is pending again."
        assert driver.find_element(By.ID, "state").text == "pending"
        assert [row[2] for row in rows(driver, "events")][-1] == "pending"
    assert scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (task,)) == "pending"


def test_a_browser_without_credentials_is_refused(console, dsn):
    from selenium.webdriver.common.by import By

    url, demo = console
    page = f"{url}/tasks/{demo.failed[0]}"
    for authorization in (None, "Bearer wrong-token-0123456789", "Basic " + base64.b64encode(b"admin:guess").decode()):
        with chromium(authorization=authorization) as driver:
            driver.get(page)
            seen: list[tuple[str, int]] = []
            wait_until(lambda: seen.extend(document_statuses(driver)) or seen, timeout=60)
            assert seen == [(page, 401)], authorization
            assert not driver.find_elements(By.ID, "task") and "550 mailbox" not in driver.page_source
    assert scalar(dsn, "SELECT state::text FROM queueworker.tasks WHERE id = %s", (demo.failed[0],)) == "failed"


def test_a_queue_named_like_a_path_cannot_resume_another_in_a_real_browser(console, dsn):
    """A name stored before migration 014 (simulated by lifting the check): its Resume button, as
    Chromium sends it, never reaches q2."""
    from selenium.webdriver.common.by import By

    url, _ = console
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE queueworker.queues DROP CONSTRAINT queues_name_pattern")
        conn.execute("ALTER TABLE queueworker.queue_events DROP CONSTRAINT queue_events_queue_pattern")
        conn.execute("INSERT INTO queueworker.queues (name, paused_until) VALUES ('evil/../q2', 'infinity'), "
                     "('q2', 'infinity')")
    with chromium(authorization=f"Bearer {TOKEN}") as driver:
        driver.get(url + "/queues")
        (row,) = [r for r in driver.find_element(By.ID, "queues").find_elements(By.TAG_NAME, "tr")
                  if r.find_elements(By.TAG_NAME, "td") and r.find_element(By.TAG_NAME, "td").text == "evil/../q2"]
        row.find_element(By.XPATH, ".//button[text()='Resume']").click()
        wait_until(lambda: driver.current_url != url + "/queues", timeout=60, message="the form to be sent")
        assert "/queues/q2/" not in driver.current_url and "done=resumed" not in driver.current_url
    assert scalar(dsn, "SELECT paused_until IS NOT NULL FROM queueworker.queues WHERE name = 'q2'")

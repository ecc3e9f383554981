"""The console as a real HTTP server (uvicorn in a thread, on a free loopback port) and a real
headless Chromium driven by selenium through Debian's chromedriver, for the browser tests and the
documentation's screenshots."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from queueworker.console import ConsoleConfig, create_app
from queueworker.dev.localpg import free_port
from tests.support import wait_until

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage")
START_TIMEOUT_SECONDS = 60


def missing_browser() -> str | None:
    """Why the browser tier cannot run here, or None."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return f"{' and '.join(missing)} missing: apt-get install -y chromium chromium-driver"
    return None


@contextlib.contextmanager
def serve(config: ConsoleConfig) -> Iterator[str]:
    """The console served on 127.0.0.1 until the block ends; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, name="console-server", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), timeout=START_TIMEOUT_SECONDS, interval=0.05,
               message="the console server to start")
    if not server.started:
        raise RuntimeError("the console server did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.contextmanager
def chromium(authorization: str | None = None, width: int = 1280, height: int = 800) -> Iterator[object]:
    """A headless Chromium in a fresh profile. With `authorization`, every request carries that
    Authorization header, as a browser does once its user has answered the basic-auth prompt."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="console-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # for document_statuses
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    os.environ.setdefault("SE_OFFLINE", "true")  # never let selenium look for drivers online
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        driver.set_page_load_timeout(60)
        if authorization:
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": authorization}})
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def document_statuses(driver) -> list[tuple[str, int]]:
    """The HTTP status of each page the browser loaded since the last call, from its network log
    (a page refused with a basic-auth challenge stays blank in a headless browser)."""
    statuses = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.responseReceived" and message["params"]["type"] == "Document":
            response = message["params"]["response"]
            if response["url"].startswith("http"):  # not the browser's own chrome:// pages
                statuses.append((response["url"], response["status"]))
    return statuses

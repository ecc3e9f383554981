"""The documentation's screenshots of the console (docs/images/console-*.png), taken by headless
Chromium from the console served on a throwaway Postgres filled with the tests' demo data.

    .venv/bin/python -m tests.console_screenshots
"""

from __future__ import annotations

from pathlib import Path

from queueworker.console import ConsoleConfig
from queueworker.dev.localpg import LocalPostgres
from queueworker.db.migrate import migrate
from tests import console_data
from tests.console_browser import chromium, serve

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
TOKEN = "screenshot-token-0123456789abcdef"


def main() -> None:
    server = LocalPostgres()
    server.start()
    try:
        migrate(server.dsn)
        demo = console_data.fill(server.dsn)
        pages = {"queues": "/queues", "tasks": "/tasks?queue=emails", "task": f"/tasks/{demo.failed[0]}",
                 "workers": "/workers"}
        with serve(ConsoleConfig(server.dsn, token=TOKEN, allow_actions=True)) as url, \
                chromium(authorization=f"Bearer {TOKEN}", width=1200, height=720) as driver:
            IMAGES.mkdir(parents=True, exist_ok=True)
            for name, path in pages.items():
                driver.get(url + path)
                target = IMAGES / f"console-{name}.png"
                driver.save_screenshot(str(target))
                print(f"{target} ({target.stat().st_size:,} bytes)")
    finally:
        server.destroy()


if __name__ == "__main__":
    main()

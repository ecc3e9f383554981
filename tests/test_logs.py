"""Unit: both log formats redact passwords wherever they appear in a record."""

from __future__ import annotations

import io
import json
import logging

import pytest

from queueworker.logs import configure_logging

PASSWORD = "Pa55-w0rd_x"
URL = f"postgresql://app:{PASSWORD}@db.example:5432/app"
TOKEN = "tok_5f3a9c0e1d2b"  # a secret that is not recognisably a URL: masked only because it is configured


@pytest.fixture
def captured():
    """What the root logger writes, once configure_logging has installed its handler."""
    stream = io.StringIO()
    yield stream
    logging.getLogger().handlers[:] = []


def _configure(stream: io.StringIO, *args, **kwargs) -> None:
    configure_logging(*args, **kwargs)
    logging.getLogger().handlers[0].setStream(stream)


def _log_everything() -> None:
    log = logging.getLogger("app")
    log.warning("connecting to %s", URL, extra={"dsn": URL, "conninfo": f"host=db password={PASSWORD}",
                                               "nested": {"urls": [URL], "token": TOKEN}, "count": 3})
    log.error("plain message with %s and %s", TOKEN, ("tuple", URL))
    try:
        raise RuntimeError(f"cannot connect with {URL} (token {TOKEN})")
    except RuntimeError:
        log.exception("failed")
    log.warning("stack", stack_info=True, extra={"why": URL})


@pytest.mark.parametrize("json_format", [True, False])
def test_no_password_or_configured_secret_reaches_the_log(captured, json_format):
    _configure(captured, "DEBUG", json_format, secrets=[TOKEN, PASSWORD])
    _log_everything()
    output = captured.getvalue()
    assert PASSWORD not in output and TOKEN not in output
    assert "app:***@db.example" in output and "cannot connect with" in output


def test_json_lines_keep_their_fields_and_types(captured):
    _configure(captured, "INFO", True, secrets=[PASSWORD])
    _log_everything()
    first, second, third, _ = (json.loads(line) for line in captured.getvalue().splitlines())
    assert first["msg"] == "connecting to postgresql://app:***@db.example:5432/app"
    assert first["dsn"] == "postgresql://app:***@db.example:5432/app" and first["count"] == 3
    assert first["conninfo"] == "host=db password=***"
    assert first["nested"]["urls"] == ["postgresql://app:***@db.example:5432/app"]
    assert third["level"] == "error" and "RuntimeError: cannot connect with postgresql://app:***@" in third["exc"]


def test_url_passwords_are_redacted_even_with_no_secret_configured(captured):
    _configure(captured, "INFO", False)
    logging.getLogger("app").warning("retrying %s", URL)
    assert captured.getvalue() == "WARNING app: retrying postgresql://app:***@db.example:5432/app\n"

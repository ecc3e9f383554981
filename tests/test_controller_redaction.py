"""No Secret value in a log line, whoever logs it and whatever formatter prints it."""

from __future__ import annotations

import io
import logging

import kopf
import psycopg
import pytest
from kopf._core.actions.loggers import ObjectJsonFormatter
from psycopg import conninfo

from queueworker_controller import redaction
from queueworker_controller.redaction import KnownSecrets, ScrubbingFilter

TOKEN = "ghp_TOKEN0123456789abcdefghijklmnop"
URL = "postgresql://app:Pw-0f-the-app@db.example:5432/orders"


def libpq_error(value: str) -> psycopg.Error:
    """What libpq says about a value it cannot parse: it echoes the value."""
    with pytest.raises(psycopg.Error) as raised:
        conninfo.conninfo_to_dict(value)
    assert value in str(raised.value)  # the leak this module exists for
    return raised.value


@pytest.fixture(params=["text", "json"])
def stream_logger(request):
    """A logger whose handler formats like kopf's (text or JSON), with the scrubbing filter."""
    secrets = KnownSecrets()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(kopf.LogFormat.FULL.value) if request.param == "text"
                         else ObjectJsonFormatter())
    redaction.install([handler], secrets)
    logger = logging.getLogger(f"test-redaction-{request.param}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, secrets, stream


def test_a_known_secret_is_masked_in_messages_arguments_and_tracebacks(stream_logger):
    logger, secrets, stream = stream_logger
    secrets.remember(("ns", "qw"), TOKEN)
    error = libpq_error(TOKEN)
    logger.warning("reading %s failed", TOKEN)
    try:
        raise RuntimeError("wrapped") from error
    except RuntimeError:
        logger.exception("Handler 'scaling_tick' failed with an exception and will try again: %s", error)
    logger.error(f"f-string with {TOKEN} inside", stack_info=True)
    output = stream.getvalue()
    assert TOKEN not in output
    assert output.count("***") >= 4
    assert "Traceback" in output and "RuntimeError: wrapped" in output  # the traceback stays, scrubbed


def test_url_passwords_are_masked_even_when_the_value_was_never_read(stream_logger):
    logger, _, stream = stream_logger
    logger.error("could not connect to %s", URL)
    assert "Pw-0f-the-app" not in stream.getvalue() and "postgresql://app:***@db.example" in stream.getvalue()


def test_the_password_alone_is_masked_too(stream_logger):
    logger, secrets, stream = stream_logger
    secrets.remember(("ns", "qw"), URL)
    logger.error("server said: password Pw-0f-the-app is wrong")
    assert "Pw-0f-the-app" not in stream.getvalue()


def test_forgotten_values_are_no_longer_kept():
    secrets = KnownSecrets()
    secrets.remember(("ns", "a"), URL)
    secrets.remember(("ns", "b"), TOKEN)
    secrets.remember(("ns", "a"), "postgresql://app@db/orders")  # rotated: the old value goes
    assert URL not in secrets.values() and "Pw-0f-the-app" not in secrets.values()
    secrets.forget(("ns", "b"))
    assert secrets.values() == ["postgresql://app@db/orders"]


def test_a_broken_format_string_still_logs_scrubbed():
    secrets = KnownSecrets()
    secrets.remember("owner", TOKEN)
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, f"{TOKEN} %s %s", ("one",), None)
    ScrubbingFilter(secrets).filter(record)
    assert TOKEN not in record.getMessage()


def test_install_everywhere_covers_the_root_and_kopfs_event_poster():
    root, objects = logging.getLogger(), logging.getLogger(redaction.KOPF_OBJECT_LOGGER)
    saved = root.handlers[:], root.level
    kopf.configure(log_format=kopf.LogFormat.JSON)
    try:
        redaction.install_everywhere(KnownSecrets())
        handlers = [*root.handlers, *objects.handlers]
        assert handlers and all(any(isinstance(f, ScrubbingFilter) for f in h.filters) for h in handlers)
        assert any(type(h).__name__ == "K8sPoster" for h in objects.handlers)
    finally:  # pytest's own capture handlers are among the root's: leave them as they were
        for handler in {*objects.handlers, *root.handlers, *saved[0]}:
            for f in [f for f in handler.filters if isinstance(f, ScrubbingFilter)]:
                handler.removeFilter(f)
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])

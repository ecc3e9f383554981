"""Logs on stderr, JSON lines (or text for humans), never carrying a password.

Every formatted line is redacted: passwords inside connection URLs and key=value strings
(`dsn.redact`), and the configured secrets (the database URL and its password) wherever they
appear literally (`dsn.scrub`). That covers the message and its arguments, `extra` fields and
exception text, whatever code logged them: a driver error, a handler or a library.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

from .dsn import scrub

# Record attributes that are not `extra` fields: the logging module's own, and uvicorn's copy of
# its message with terminal colours.
_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}
LEVELS = ("debug", "info", "warning", "error", "critical")


class _Redacting:
    """Scrubbing shared by both formatters."""

    def __init__(self, secrets: Iterable[str | None] = ()):
        self.secrets = tuple(s for s in secrets if s)

    def clean(self, value: Any) -> Any:
        """`value` with every string in it scrubbed; values JSON cannot hold become scrubbed text."""
        if isinstance(value, str):
            return scrub(value, self.secrets)
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, dict):
            return {self.clean(str(k)): self.clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [self.clean(item) for item in value]
        return scrub(str(value), self.secrets)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the record's `extra` fields, exc."""

    def __init__(self, secrets: Iterable[str | None] = ()):
        super().__init__()
        self._redacting = _Redacting(secrets)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _RESERVED})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(self._redacting.clean(entry))


class TextFormatter(logging.Formatter):
    """`HH:MM:SS LEVEL logger: message key=value ...` for a person at a terminal: the same
    `extra` fields as the JSON lines (values as JSON), and any traceback, redacted as a whole."""

    def __init__(self, secrets: Iterable[str | None] = ()):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
        self._redacting = _Redacting(secrets)

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k not in _RESERVED}
        text = super().format(record)
        if fields:
            head, newline, rest = text.partition("\n")  # the fields go on the message's line
            pairs = " ".join(f"{key}={json.dumps(self._redacting.clean(value), ensure_ascii=False)}"
                             for key, value in fields.items())
            text = f"{head} {pairs}{newline}{rest}"
        return self._redacting.clean(text)


def default_format(stream: Any = None) -> str:
    """`text` on a terminal, where a person reads it; `json` elsewhere (a pod, a file, a pipe),
    where a log collector does."""
    stream = sys.stderr if stream is None else stream
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # a closed or odd stream
        return "json"


def configure_logging(level: str = "INFO", json_format: bool = True, secrets: Iterable[str | None] = ()) -> None:
    """Routes every logger to stderr through a redacting formatter; `secrets` are masked
    wherever they appear literally (pass the database URL and its password)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(secrets) if json_format else TextFormatter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

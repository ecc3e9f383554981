"""No Secret value in a log line: the values the controller has read, masked in every record.

Status fields and Events are built from explained errors (`queueworker.dsn.explain`) and never
see a Secret value. Log lines are harder to guard one by one: a traceback, a library's message
or kopf's own "handler failed" line can carry whatever an exception held (libpq echoes the
connection string it could not parse). So every handler of the root logger and of kopf's
object logger gets `ScrubbingFilter`, which formats the record (message, arguments, traceback
and stack) once and masks every Secret value currently in use, plus anything that looks like a
password in a URL or key=value string.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Hashable, Iterable

from queueworker import dsn as dsn_text

# kopf's per-object logger; its handler posts log records as Events when kopf is told to.
KOPF_OBJECT_LOGGER = "kopf.objects"


class KnownSecrets:
    """The Secret values each QueueWorker last read, to mask them wherever they might surface.
    Bounded: one entry per QueueWorker, replaced on every read, dropped when it is deleted."""

    def __init__(self) -> None:
        self._by_owner: dict[Hashable, tuple[str, ...]] = {}
        self._distinct: list[str] | None = None
        self._lock = threading.Lock()

    def remember(self, owner: Hashable, value: str) -> None:
        known = self._by_owner.get(owner)
        if known and known[0] == value:  # every tick remembers: only a new value costs a parse
            return
        secrets = [value]
        try:
            secrets.append(dsn_text.parse(value).get("password") or "")
        except dsn_text.InvalidDsn:
            pass
        with self._lock:
            self._by_owner[owner] = tuple(s for s in secrets if s)
            self._distinct = None

    def forget(self, owner: Hashable) -> None:
        with self._lock:
            self._by_owner.pop(owner, None)
            self._distinct = None

    def values(self) -> list[str]:
        """Each distinct value once (QueueWorkers sharing a Secret share its values), longest first,
        computed again only after a change: every log record is scrubbed with them."""
        with self._lock:
            if self._distinct is None:
                self._distinct = sorted({v for values in self._by_owner.values() for v in values}, key=len,
                                        reverse=True)
            return self._distinct

    def scrub(self, text: str) -> str:
        return dsn_text.scrub(text, self.values())


known_secrets = KnownSecrets()


class ScrubbingFilter(logging.Filter):
    """Renders each record's text once, scrubbed, so no formatter can print the raw values."""

    def __init__(self, secrets: KnownSecrets):
        super().__init__()
        self._secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format string must not hide the line
            message = f"{record.msg!r} (unformattable arguments)"
        record.msg, record.args = self._secrets.scrub(message), None
        if record.exc_info and record.exc_info != (None, None, None):
            record.exc_text = self._secrets.scrub("".join(traceback.format_exception(*record.exc_info)).rstrip())
        record.exc_info = None  # formatters (JSON ones too) fall back to the scrubbed exc_text
        if record.exc_text:
            record.exc_text = self._secrets.scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = self._secrets.scrub(record.stack_info)
        return True


def install(handlers: Iterable[logging.Handler], secrets: KnownSecrets = known_secrets) -> None:
    """Adds the filter to each handler (once)."""
    for handler in handlers:
        if not any(isinstance(f, ScrubbingFilter) for f in handler.filters):
            handler.addFilter(ScrubbingFilter(secrets))


def install_everywhere(secrets: KnownSecrets = known_secrets) -> None:
    """The filter on every handler that can emit a controller record: the root logger's (kopf's
    stream handler among them) and kopf's object logger's (its Event poster)."""
    install([*logging.getLogger().handlers, *logging.getLogger(KOPF_OBJECT_LOGGER).handlers], secrets)

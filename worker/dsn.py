"""Database connection strings without leaks: validation, safe descriptions, redaction, and
connection errors explained in words that never carry a secret.

libpq echoes what it cannot parse ("missing "=" after "<the whole value>" in connection info
string"), so an API token stored where a URL was expected, or a URL with a typo in its scheme,
would reach a log line, a status field or an Event verbatim, password included. Everything that
reports on a connection goes through this module instead of printing the driver's text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg
from psycopg import conninfo

MASK = "***"
URL_SCHEMES = ("postgresql", "postgres")

# user:password@ inside any URL-looking text, and password=... in key=value connection strings.
# ASCII whitespace only: a password (even an invalid one) may hold any other character.
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*:)(?P<secret>[^\s@]*)(?P<tail>@)",
                           re.ASCII)
_KV_PASSWORD = re.compile(r"(?P<head>(?<![?&])\bpassword\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|[^\s'\"]+)",
                          re.IGNORECASE | re.ASCII)
_URL_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<secret>[^&\s'\"]+)", re.IGNORECASE | re.ASCII)


class InvalidDsn(ValueError):
    """The connection string cannot be parsed. The message never repeats the string."""


@dataclass(frozen=True)
class Target:
    """Where a connection string points, without its password: safe to log and to show."""

    user: str | None
    host: str | None
    port: str | None
    dbname: str | None

    @property
    def address(self) -> str:
        host = self.host or "local socket"
        return f"{host}:{self.port}" if self.port else host

    def __str__(self) -> str:
        who = f"user {self.user} at " if self.user else ""
        return f"{who}{self.address}" + (f"/{self.dbname}" if self.dbname else "")


def redact(text: str) -> str:
    """`text` with every password of a URL or key=value connection string replaced by ***."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}{m['tail']}", text)
    text = _URL_QUERY_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)
    return _KV_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """`text` redacted, and with every occurrence of the given secret values masked too (for values
    that are not recognisably URLs, such as a token stored by mistake). A secret is masked where it
    stands as a token of its own, not inside a longer word: with the password `bench`, the task
    `bench_sleep` and the database `queueworker_bench` stay readable and say nothing of it, while
    `password "bench"` or `:bench@` is masked."""
    for secret in sorted((s for s in secrets if s and len(s) >= 3), key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9_]){re.escape(secret)}(?![A-Za-z0-9_])", MASK, text)
    return redact(text)


def parse(dsn: str) -> dict[str, str]:
    """The connection string's parameters; raises InvalidDsn with a message that never repeats it."""
    if not isinstance(dsn, str) or not dsn.strip():
        raise InvalidDsn("the database URL is empty")
    if "\x00" in dsn:
        raise InvalidDsn("the database URL contains a NUL byte")
    scheme = re.match(r"^\s*([A-Za-z][A-Za-z0-9+.-]*)://", dsn)
    if scheme and scheme[1].lower() not in URL_SCHEMES:
        raise InvalidDsn(f"the database URL has scheme {scheme[1][:20]!r}; expected postgresql:// or postgres://")
    try:
        return conninfo.conninfo_to_dict(dsn)  # type: ignore[return-value]
    except psycopg.ProgrammingError as exc:
        detail = _parse_problem(str(exc))
        raise InvalidDsn("the database URL is not a valid Postgres connection string"
                         + (f" ({detail})" if detail else "")) from None


def validate(dsn: str) -> Target:
    """Parses the connection string and returns where it points; raises InvalidDsn."""
    params = parse(dsn)
    port = params.get("port")
    if port is not None and not all(part.strip().isdigit() for part in str(port).split(",")):
        raise InvalidDsn("the database URL has a port that is not a number")
    return target(params)


def target(dsn_or_params: str | dict[str, str]) -> Target:
    params = parse(dsn_or_params) if isinstance(dsn_or_params, str) else dsn_or_params
    return Target(params.get("user"), params.get("host") or params.get("hostaddr"), params.get("port"),
                  params.get("dbname"))


def describe(dsn: str) -> str:
    """`user app at db:5432/app`, or a placeholder when the string cannot be parsed."""
    try:
        return str(target(dsn))
    except InvalidDsn:
        return "an invalid database URL"


# (pattern in libpq's or psycopg's message, explanation; {user}, {db}, {address}, {host} filled in)
_EXPLANATIONS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.IGNORECASE), e) for p, e in (
    (r"password authentication failed for user \"(?P<user>[^\"]*)\"",
     'password authentication failed for user "{user}"'),
    (r"no password supplied|fe_sendauth", 'the server asks for a password and the URL has none (user "{user}")'),
    (r"no pg_hba\.conf entry for host", 'the server refuses connections from this host for user "{user}" '
                                         "(no pg_hba.conf entry)"),
    (r"database \"(?P<db>[^\"]*)\" does not exist", 'database "{db}" does not exist'),
    (r"role \"(?P<user>[^\"]*)\" does not exist", 'role "{user}" does not exist'),
    (r"timeout expired|timed out", "connection to {address} timed out"),
    (r"connection refused", "connection to {address} refused (is the server running and reachable?)"),
    (r"failed to resolve host|could not translate host name|name or service not known|"
     r"temporary failure in name resolution", "host {host} not found"),
    (r"SSL|certificate", "the TLS handshake with {address} failed"),
    (r"too many connections|remaining connection slots", "the server at {address} has no free connection slots"),
    (r"the database system is (starting up|shutting down|in recovery mode)",
     "the server at {address} is starting up or shutting down"),
    (r"invalid (\w+ )?value.* for connection option \"(?P<option>[^\"]*)\"", "invalid value for connection option"
                                                                              " {option}"),
    (r"invalid sslmode value", "invalid value for connection option sslmode"),
    (r"server closed the connection unexpectedly|connection is lost|consuming input failed|"
     r"terminating connection", "the connection to {address} was lost"),
    (r"canceling statement due to statement timeout|query_canceled", "a statement on {address} timed out"),
))


def explain(exc: BaseException, dsn: str | None) -> str:
    """A one-line, secret-free explanation of a database error met while using `dsn`.

    Known causes get a fixed sentence; anything else gets the error's first line with passwords,
    the connection string and its password scrubbed out."""
    if isinstance(exc, InvalidDsn):
        return str(exc)
    try:
        where = target(dsn) if dsn else Target(None, None, None, None)
    except InvalidDsn as invalid:
        return str(invalid)
    text = str(exc)
    secrets = [dsn, (parse(dsn).get("password") if dsn else None)]
    for pattern, explanation in _EXPLANATIONS:
        match = pattern.search(text)
        if match:
            found = match.groupdict()
            return explanation.format(user=found.get("user") or where.user or "?", db=found.get("db") or where.dbname,
                                      address=where.address, host=where.host or "local socket",
                                      option=found.get("option") or "?")
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return scrub(first, secrets)[:300]


def _parse_problem(message: str) -> str:
    """What libpq disliked, without the value it echoes."""
    if message.startswith("missing \"=\""):
        return "expected postgresql://user:password@host/db or key=value pairs"
    option = re.search(r'invalid (?:URI query parameter|connection option): "([A-Za-z_]{1,40})"', message)
    if option:
        return f"unknown option {option[1]!r}"
    if "unterminated quoted string" in message:
        return "unterminated quoted string"
    if "invalid percent-encoded token" in message:
        return "invalid percent-encoding"
    return ""

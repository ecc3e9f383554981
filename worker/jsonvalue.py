"""JSON that Postgres will store, JSON from Postgres that Python can read, and text that is safe
to put in a `jsonb` error.

Postgres refuses some JSON that Python's `json` module writes happily: NaN and Infinity, the
escape for NUL (`\\u0000`) and lone UTF-16 surrogates (`\\ud800`). Python cannot read some JSON that
Postgres stores happily (rows written by other languages or plain SQL): nesting deeper than the
interpreter's recursion limit, integers longer than 4,300 digits. Both directions go through
here, so one bad value fails only its own task, with a message that says what is wrong.
"""

from __future__ import annotations

import json
import re
from typing import Any

# `\u0000` or a UTF-16 surrogate escape, preceded by an even number of backslashes (so an escaped
# backslash followed by the letters "u0000" is not mistaken for one).
_SUSPECT_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u(?:0000|[dD][89a-fA-F])")


# One encoder for every call: json.dumps with any non-default option builds a new one each time.
_STRICT_ENCODER = json.JSONEncoder(allow_nan=False)


class NotStorable(ValueError):
    """A value Postgres would refuse as `jsonb`; the message says why."""


class Undecodable(ValueError):
    """Stored JSON that cannot be turned into Python values; the message says why."""


class InvalidJson(Undecodable):
    """The text is not JSON at all."""


def encode(value: Any, limit_bytes: int | None = None) -> str:
    """`value` as JSON text Postgres accepts, or NotStorable. ASCII only (non-ASCII characters
    are escaped), so the text is always encodable however odd the strings inside are."""
    try:
        text = _STRICT_ENCODER.encode(value)
    except RecursionError:
        raise NotStorable("nested too deeply (the limit is about 1,000 levels)") from None
    except ValueError as exc:
        message = str(exc)
        if "Out of range float" in message:
            raise NotStorable("NaN and Infinity are not valid JSON") from None
        if "integer string conversion" in message:
            raise NotStorable("an integer has more than 4,300 digits") from None
        raise NotStorable(message) from None
    except TypeError as exc:
        raise NotStorable(f"not JSON-serialisable: {exc}") from None
    # The substring test is a fast path: most payloads hold no escape at all.
    if "\\u" in text and _SUSPECT_ESCAPE.search(text):
        problem = _string_problem(value)
        if problem:
            raise NotStorable(problem)
    if limit_bytes is not None and len(text) > limit_bytes:
        raise NotStorable(f"{len(text):,} bytes of JSON exceed the limit of {limit_bytes:,}")
    return text


def decode(text: str | bytes) -> Any:
    """Python values from stored JSON text, or Undecodable."""
    try:
        return json.loads(text)
    except RecursionError:
        raise Undecodable("nested too deeply for Python (the limit is about 1,000 levels)") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise Undecodable("an integer has more than 4,300 digits") from None
        raise InvalidJson(f"not valid JSON: {exc}") from None


def safe_text(text: str, limit: int | None = None, keep_end: bool = False) -> str:
    """`text` with what a `jsonb` string cannot hold spelled out: NUL as `\\x00`, a lone
    surrogate as `\\udXXX`; then cut to `limit` characters, keeping the start (a message says
    what happened first) or, with `keep_end`, the end (a traceback's cause is at its end)."""
    if limit is not None and len(text) > limit:  # escaping only lengthens: cut the raw text first
        text = text[-limit:] if keep_end else text[:limit]
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(text) > limit:
        text = "…" + text[-(limit - 1):] if keep_end else text[:limit - 1] + "…"
    return text


def _string_problem(value: Any) -> str | None:
    """What makes a value's strings (keys included) unstorable, found without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings: list[str] = [item]
        elif isinstance(item, dict):
            strings = [k for k in item if isinstance(k, str)]
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
            continue
        else:
            continue
        for string in strings:
            if "\x00" in string:
                return "a string contains a NUL character (\\u0000), which Postgres cannot store"
            try:
                string.encode("utf-8")
            except UnicodeEncodeError:
                return "a string contains a lone UTF-16 surrogate, which is not valid Unicode"
    return None

"""jsonvalue: what encode() accepts, Postgres stores; what it refuses, Postgres would refuse (or could
not be read back); decode() turns unreadable stored JSON into one clear error."""

from __future__ import annotations

import json
import math

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queueworker import jsonvalue

# Any text at all: NUL, lone surrogates, non-BMP characters, backslashes followed by "u0000".
ANY_TEXT = st.one_of(st.text(), st.lists(st.sampled_from(["\x00", "\ud800", "\udfff", "\\", "u0000", "\U0001f600",
                                                         "a", "\"", "\n"])).map("".join))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                    ANY_TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(ANY_TEXT, inner, max_size=4)), max_leaves=20)


def _clean(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return "\x00" not in value and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return all(_clean(v) for v in value)
    if isinstance(value, dict):
        return all(_clean(k) and _clean(v) for k, v in value.items())
    return True


@given(VALUES)
def test_encode_refuses_exactly_the_unstorable_values(value):
    if _clean(value):
        assert json.loads(jsonvalue.encode(value)) == value
    else:
        with pytest.raises(jsonvalue.NotStorable):
            jsonvalue.encode(value)


def test_encode_explains_each_refusal():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    cases = {float("nan"): "NaN", float("-inf"): "NaN", "a\x00b": "NUL", "\ud800": "surrogate",
             10 ** 5000: "4,300 digits", frozenset(): "not JSON-serialisable"}
    for value, fragment in cases.items():
        with pytest.raises(jsonvalue.NotStorable, match=fragment):
            jsonvalue.encode(value)
    with pytest.raises(jsonvalue.NotStorable, match="nested too deeply"):
        jsonvalue.encode(deep)
    with pytest.raises(jsonvalue.NotStorable, match="exceed the limit of 1,024"):
        jsonvalue.encode("x" * 2000, limit_bytes=1024)


def test_decode_explains_what_python_cannot_read():
    with pytest.raises(jsonvalue.Undecodable, match="nested too deeply"):
        jsonvalue.decode("[" * 2000 + "]" * 2000)
    with pytest.raises(jsonvalue.Undecodable, match="4,300 digits"):
        jsonvalue.decode("9" * 5000)
    with pytest.raises(jsonvalue.Undecodable, match="not valid JSON"):
        jsonvalue.decode("{nope")


@given(ANY_TEXT)
def test_safe_text_is_always_storable(text):
    safe = jsonvalue.safe_text(text)
    assert json.loads(jsonvalue.encode(safe)) == safe


@pytest.mark.integration
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES)
def test_postgres_stores_whatever_encode_accepts(dsn, value):
    try:
        text = jsonvalue.encode(value)
    except jsonvalue.NotStorable:
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        stored = conn.execute("SELECT %s::text::jsonb::text", (text,)).fetchone()[0]
    # Postgres keeps numbers as decimals (1e16 comes back as 10000000000000000): compare as floats.
    assert json.loads(stored, parse_int=float) == json.loads(text, parse_int=float)

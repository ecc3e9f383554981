"""Connection strings never leak: validation, redaction and explained connection errors."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueworker import dsn

TOKEN = "ghp_SECRETTOKEN1234567890"


@pytest.mark.parametrize("text, expected", [
    ("postgresql://app:s3cr%21t@db:5432/app", "postgresql://app:***@db:5432/app"),
    ("see postgres://u:p@h/d and postgresql://v:q@i/e", "see postgres://u:***@h/d and postgresql://v:***@i/e"),
    ("host=db password=hunter2 user=app", "host=db password=*** user=app"),
    ("host=db password='two words' user=app", "host=db password=*** user=app"),
    ("postgresql://db/app?user=u&password=pw&sslmode=require", "postgresql://db/app?user=u&password=***&sslmode=require"),
    ("postgresql://app@db/app", "postgresql://app@db/app"),
])
def test_redact_masks_passwords(text, expected):
    assert dsn.redact(text) == expected


@given(st.text(alphabet=st.characters(blacklist_characters="@/:?#&'\" \t\n\r\x00\\", min_codepoint=33),
               min_size=3, max_size=40))
def test_redact_never_lets_a_url_password_through(password):
    url = f"postgresql://app:{password}@db.example:5432/app"
    # Compared whole: a short password may well be a substring of the rest ("pos" of "postgresql").
    assert dsn.redact(f"connect failed for {url}: boom") == \
        "connect failed for postgresql://app:***@db.example:5432/app: boom"


@pytest.mark.parametrize("value, fragment", [
    (TOKEN, "not a valid Postgres connection string"),
    (f"postgresq://app:{TOKEN}@db/app", "scheme 'postgresq'"),
    ("", "empty"),
    ("host=db\x00", "NUL"),
    (f"postgresql://app:{TOKEN}@db/app?foo=bar", "unknown option 'foo'"),
    (f"postgresql://app:{TOKEN}@db:notaport/app", "port that is not a number"),
])
def test_invalid_urls_are_refused_without_repeating_them(value, fragment):
    with pytest.raises(dsn.InvalidDsn) as caught:
        dsn.validate(value)
    assert fragment in str(caught.value)
    assert TOKEN not in str(caught.value)


def test_describe_names_the_target_without_the_password():
    assert dsn.describe(f"postgresql://app:{TOKEN}@db:5432/orders") == "user app at db:5432/orders"
    assert dsn.describe(TOKEN) == "an invalid database URL"


@pytest.mark.parametrize("message, expected", [
    ('connection failed: connection to server at "10.0.0.5", port 5432 failed: FATAL:  password authentication '
     'failed for user "app"', 'password authentication failed for user "app"'),
    ('connection failed: connection to server at "10.0.0.5", port 5432 failed: FATAL:  database "nodb" does not '
     'exist', 'database "nodb" does not exist'),
    ('connection failed: connection to server at "10.0.0.5", port 5432 failed: Connection refused\n\tIs the server '
     'running on that host and accepting TCP/IP connections?', "connection to db:5432 refused"),
    ("connection timeout expired", "connection to db:5432 timed out"),
    ("failed to resolve host 'db': [Errno -2] Name or service not known", "host db not found"),
    ('connection is bad: invalid integer value "x" for connection option "port"',
     "invalid value for connection option port"),
])
def test_connection_errors_are_explained(message, expected):
    explained = dsn.explain(psycopg.OperationalError(message), f"postgresql://app:{TOKEN}@db:5432/app")
    assert explained.startswith(expected)
    assert TOKEN not in explained


def test_unknown_errors_keep_their_first_line_scrubbed():
    url = f"postgresql://app:{TOKEN}@db:5432/app"
    explained = dsn.explain(psycopg.OperationalError(f"weird failure near {url} and {TOKEN}\nsecond line"), url)
    assert explained == "weird failure near *** and ***"


def test_a_secret_is_masked_as_a_token_not_inside_longer_words():
    text = 'task bench_sleep failed in queueworker_bench: password "bench" for postgresql://u:bench@db/x (bench)'
    assert dsn.scrub(text, ["bench"]) == \
        'task bench_sleep failed in queueworker_bench: password "***" for postgresql://u:***@db/x (***)'
    assert dsn.scrub("p@ss!-word and xp@ss!-word", ["p@ss!-word"]) == "*** and xp@ss!-word"


def test_explain_on_an_unparseable_value_never_echoes_it():
    explained = dsn.explain(psycopg.ProgrammingError(f'missing "=" after "{TOKEN}" in connection info string'),
                            TOKEN)
    assert TOKEN not in explained
    assert "not a valid Postgres connection string" in explained

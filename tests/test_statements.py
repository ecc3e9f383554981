"""Every statement queueworker runs matches its declared types: each is prepared against a freshly
migrated database (one for the module), and the server's view of its placeholders and result
columns is compared with the statement's parameter type and row type. A column that moves, a
placeholder whose type changes, or a row type that no longer fits fails here, not in production."""

from __future__ import annotations

import importlib
import pkgutil
import types
import typing
from datetime import datetime
from pathlib import Path
from uuid import UUID

import psycopg
import pytest

import queueworker.db
from queueworker.db import statements
from queueworker.db.enqueue import CREATE_STAGING
from queueworker.db.statements import JsonText, Statement
from tests.support import numbered

DB_DIR = Path(queueworker.db.__file__).parent

# What each Python type may stand for, by the server's type name (arrays: "_" and the element's).
ACCEPTS: dict[object, set[str]] = {
    int: {"int2", "int4", "int8"},
    float: {"float4", "float8", "numeric"},
    str: {"text", "varchar", "name", "bpchar", "unknown"},
    bool: {"bool"},
    datetime: {"timestamptz"},
    UUID: {"uuid"},
    bytes: {"bytea"},
}
JSON = {"jsonb", "json"}


def _modules() -> list[types.ModuleType]:
    return [importlib.import_module(info.name)
            for info in pkgutil.iter_modules(queueworker.db.__path__, "queueworker.db.")]


def all_statements() -> list[Statement]:
    found = {id(value): value for module in _modules() for value in vars(module).values()
             if isinstance(value, Statement)}
    return sorted(found.values(), key=lambda statement: statement.name)


def _accepted(annotation: object, enums: set[str]) -> set[str]:
    """The server types a declared Python type may stand for."""
    if typing.get_origin(annotation) is typing.Annotated:
        if annotation == JsonText:
            return JSON
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_accepted(arg, enums) for arg in typing.get_args(annotation) if arg is not type(None)))
    if origin is list:
        return {"_" + name for name in _accepted(typing.get_args(annotation)[0], enums)}
    if annotation is str:
        return ACCEPTS[str] | enums
    if annotation not in ACCEPTS:
        raise AssertionError(f"no server type is declared for the Python type {annotation!r}")
    return ACCEPTS[annotation]


def test_every_sql_file_is_declared_by_a_module_of_its_name():
    stems = {path.stem for path in DB_DIR.glob("*.sql")}
    declared = {statement.name.split(".")[0] for statement in all_statements()}
    assert stems == declared
    assert all(statement.text.strip() and not statement.text.rstrip().endswith(";") for statement in all_statements())


def test_a_sql_file_is_read_statement_by_statement():
    texts = statements.parse("-- header\n\n-- name: one\n-- what it does\nSELECT 1\n  AS one;\n\n-- name: two\nSELECT 2;\n")
    assert texts == {"one": "SELECT 1\n  AS one", "two": "SELECT 2"}
    with pytest.raises(ValueError, match="named twice"):
        statements.parse("-- name: one\nSELECT 1;\n-- name: one\nSELECT 2;\n")
    with pytest.raises(ValueError, match="empty"):
        statements.parse("-- name: one\n-- nothing here\n")


def test_a_statement_refuses_parameters_of_another_type():
    from queueworker.db import lease
    with pytest.raises(TypeError, match="takes LockQueueParams"):
        lease.LOCK_QUEUE.bind(lease.DeregisterWorkerParams(worker=UUID(int=1)))
    with pytest.raises(TypeError):
        lease.LockQueueParams(queue="q", other=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        lease.LockQueueParams("q")  # type: ignore[misc]  # keywords only


@pytest.mark.integration
@pytest.mark.parametrize("statement", all_statements(), ids=lambda statement: statement.name)
def test_the_statement_matches_its_declared_parameter_and_row_types(module_dsn, statement):
    # One database for every statement: preparing and describing change nothing, and a script runs
    # in a transaction that is rolled back.
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        type_names = dict(conn.execute("SELECT oid::int, typname::text FROM pg_type").fetchall())
        enums = {name for (name,) in conn.execute("SELECT typname::text FROM pg_type WHERE typtype = 'e'")}
        # The staging table the producer's COPY path fills exists only in its transaction: made here as
        # enqueue.sql's create_staging makes it, kept past this autocommit statement.
        conn.execute(CREATE_STAGING.text.replace("ON COMMIT DROP", ""))
        text, names = numbered(statement.text)
        prepared = conn.pgconn.prepare(b"checked", text.encode())
        if prepared.status != psycopg.pq.ExecStatus.COMMAND_OK:
            message = prepared.error_message.decode()
            assert "cannot insert multiple commands" in message, f"{statement.name}: {message}"
            # A script (several commands): it takes nothing, returns nothing, and runs.
            assert statement.params is statements.NoParams and statement.row is None
            with conn.transaction(force_rollback=True):
                conn.execute(statement.text)
            return
        described = conn.pgconn.describe_prepared(b"checked")

    hints = typing.get_type_hints(statement.params, include_extras=True)
    assert set(names) == set(hints), statement.name
    for position, name in enumerate(names):
        server_type = type_names[described.param_type(position)]
        assert server_type in _accepted(hints[name], enums), \
            f"{statement.name}: parameter {name} is {server_type} on the server, declared {hints[name]}"

    columns = [(described.fname(i).decode(), type_names[described.ftype(i)]) for i in range(described.nfields)]
    if statement.row is None:
        return
    assert [name for name, _ in columns] == list(statement.row._fields), statement.name
    row_hints = typing.get_type_hints(statement.row, include_extras=True)
    for name, server_type in columns:
        assert server_type in _accepted(row_hints[name], enums), \
            f"{statement.name}: column {name} is {server_type}, {statement.row.__name__} declares {row_hints[name]}"

"""Statements: SQL written out whole in `.sql` files, each run with typed parameters and typed rows.

Every statement queueworker runs lives in a `.sql` file of this package, one file per concern
(`lease.sql`, `enqueue.sql`, ...), under a `-- name: NAME` line; the Python module of the same
name declares it once as a `Statement`: its text, a parameter type (a frozen, keyword-only
dataclass whose fields are the statement's `%(name)s` placeholders) and a row type (a NamedTuple
whose fields are its result columns, in order), or no row type for a statement run for its effect.
Rows are built by column name, so a statement whose columns moved fails loudly instead of handing
a value to the wrong field; tests/test_statements.py prepares every statement against a migrated
database and compares its placeholders and result columns with the declared types.

One way to run a statement on each kind of connection:

- a psycopg `Connection`: `fetch`, `fetch_one`, `execute` (and `copy_rows` for COPY ... FROM STDIN);
- a psycopg `AsyncConnection`: `fetch_async`, `fetch_one_async`, `execute_async`, `copy_rows_async`;
- a worker's duty connection (queueworker.db.connection.DutyConnection), which adds a deadline and
  reconnects: its `fetch` and `execute` methods, which call `fetch_async`.

On a connection queueworker does not own (an application's, the CLI's) statements are never
prepared (`prepare=False`, the default here): it may go through a pooler in transaction mode, where
a statement prepared on one server connection is missing on the next. A worker's own connections
pass `prepare=None`, leaving it to the connection's `prepare_threshold`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, NamedTuple, TypeVar, dataclass_transform

import psycopg
from psycopg.rows import RowMaker

P = TypeVar("P", bound="Params")
R = TypeVar("R", bound=tuple)

# A parameter holding JSON as text, cast to jsonb by the statement (psycopg sends text untyped, so
# the server parses it once, as the column's type): what tests/test_statements.py expects of a
# jsonb placeholder.
JsonText = Annotated[str, "json"]

_NAME_LINE = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$")
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


@dataclass_transform(kw_only_default=True, frozen_default=True)
class Params:
    """Base of every statement's parameter type. A subclass declares one annotated field per
    placeholder; instances take exactly those, by keyword (a missing, misspelt, extra or positional
    parameter fails where the statement is called), cannot be changed, and hand their values to
    psycopg as their own `__dict__`, without a copy.

    Not a dataclass: generating one costs about a millisecond per class at import, and there are
    a hundred of them on a worker's start-up path; this costs nothing until instances are made,
    and making one costs what a dict does."""

    # The placeholders in declaration order, set per subclass (not annotated: annotations are fields).
    _fields = ()
    _field_set = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names = dict.fromkeys(name for klass in reversed(cls.__mro__)
                              for name in vars(klass).get("__annotations__", {}) if not name.startswith("_"))
        cls._fields = tuple(names)
        cls._field_set = frozenset(names)

    def __init__(self, **values: Any) -> None:
        if values.keys() != self._field_set:
            missing = sorted(self._field_set - values.keys())
            unknown = sorted(values.keys() - self._field_set)
            raise TypeError(f"{type(self).__name__}: " + "; ".join(
                part for part in (f"missing {', '.join(missing)}" if missing else "",
                                  f"unknown {', '.join(unknown)}" if unknown else "") if part))
        object.__setattr__(self, "__dict__", values)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} cannot be changed")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} cannot be changed")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.__dict__ == self.__dict__

    def __hash__(self) -> int:
        return hash((type(self), tuple(self.__dict__[name] for name in self._fields)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{name}={self.__dict__[name]!r}' for name in self._fields)})"


class NoParams(Params):
    """The parameters of a statement that takes none."""


NO_PARAMS = NoParams()


@dataclass(frozen=True, eq=False)
class Statement(Generic[P, R]):
    """One named statement of a `.sql` file, with its declared parameter and row types. `row` is
    None for a statement run for its effect (`execute`)."""

    name: str          # "<file>.<name>", as in the .sql file
    text: str
    params: type[P]
    row: type[R] | None

    def bind(self, params: P) -> dict[str, Any] | None:
        """The values psycopg sends: the parameters' own attributes (None when there are none, so a
        statement without placeholders goes out as written)."""
        if type(params) is not self.params:
            raise TypeError(f"{self.name} takes {self.params.__name__}, not {type(params).__name__}")
        return params.__dict__ or None


class SqlFile:
    """The statements of one `.sql` file of this package, declared by the module of the same name.

    `statement()` takes each one out under its name; `check_all_declared()` (called at the end of the
    declaring module) fails if the file holds a statement no module declares, so no SQL is left
    behind unused, and a typo in a name fails at import."""

    def __init__(self, stem: str):
        self.stem = stem
        # A plain read beside this module (importlib.resources costs a worker's start-up several ms).
        self._texts = parse(Path(__file__).with_name(f"{stem}.sql").read_text())
        self._declared: set[str] = set()

    def statement(self, name: str, params: type[P], row: type[R] | None = None) -> Statement[P, R]:
        try:
            text = self._texts[name]
        except KeyError:
            raise LookupError(f"{self.stem}.sql has no statement named {name!r}") from None
        expected = set(params._fields)
        used = set(_PLACEHOLDER.findall(text))
        if used != expected:
            raise TypeError(f"{self.stem}.{name} uses the parameters {sorted(used)}, {params.__name__} declares "
                            f"{sorted(expected)}")
        self._declared.add(name)
        return Statement(f"{self.stem}.{name}", text, params, row)

    def check_all_declared(self) -> None:
        left = sorted(set(self._texts) - self._declared)
        if left:
            raise LookupError(f"{self.stem}.sql holds statements no module declares: {', '.join(left)}")


def parse(source: str) -> dict[str, str]:
    """The named statements of a `.sql` file: each `-- name: NAME` line starts one, which runs to
    the next. The comment lines right below the name are the statement's description, kept in the
    file for readers and left out of the text sent to the server, as are a trailing semicolon and
    blank lines around it."""
    texts: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []

    def close() -> None:
        if name is None:
            return
        while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
            lines.pop(0)
        text = "\n".join(lines).strip()
        if text.endswith(";"):
            text = text[:-1].rstrip()
        if not text:
            raise ValueError(f"statement {name!r} is empty")
        texts[name] = text

    for line in source.splitlines():
        match = _NAME_LINE.match(line)
        if match:
            close()
            name, lines = match[1], []
            if name in texts:
                raise ValueError(f"statement {name!r} is named twice")
        elif name is not None:
            lines.append(line)
    close()
    return texts


def typed_rows(row: type[R]) -> Any:
    """A psycopg row factory making `row` (a NamedTuple) of each row. The statement's column names
    are checked against the row type's fields once per result, then rows are built from their
    values directly: as cheap as plain tuples, and read by name everywhere."""
    def factory(cursor: Any) -> RowMaker[R]:
        names = tuple(column.name for column in cursor.description or ())
        if names != row._fields:  # type: ignore[attr-defined]
            raise TypeError(f"the statement returns {names}, {row.__name__} expects {row._fields}")  # type: ignore
        return row._make  # type: ignore[attr-defined]
    return factory


def _rows_of(statement: Statement[Any, R]) -> type[R]:
    if statement.row is None:
        raise TypeError(f"{statement.name} returns no rows: run it with execute")
    return statement.row


def fetch(conn: psycopg.Connection[Any], statement: Statement[P, R], params: P, *,
          prepare: bool | None = False) -> list[R]:
    """Runs the statement and returns its rows."""
    with conn.cursor(row_factory=typed_rows(_rows_of(statement))) as cursor:
        cursor.execute(statement.text, statement.bind(params), prepare=prepare)
        return cursor.fetchall()


def fetch_one(conn: psycopg.Connection[Any], statement: Statement[P, R], params: P, *,
              prepare: bool | None = False) -> R | None:
    """Runs the statement and returns its first row, None when it returns none."""
    rows = fetch(conn, statement, params, prepare=prepare)
    return rows[0] if rows else None


def execute(conn: psycopg.Connection[Any], statement: Statement[P, Any], params: P, *,
            prepare: bool | None = False) -> None:
    """Runs a statement for its effect."""
    conn.execute(statement.text, statement.bind(params), prepare=prepare)


def copy_rows(conn: psycopg.Connection[Any], statement: Statement[NoParams, Any], rows: Iterable[tuple]) -> None:
    """Runs a `COPY ... FROM STDIN` statement, sending `rows` (tuples, in the statement's column order)."""
    with conn.cursor().copy(statement.text) as copy:
        for row in rows:
            copy.write_row(row)


async def fetch_async(conn: psycopg.AsyncConnection[Any], statement: Statement[P, R], params: P, *,
                      prepare: bool | None = False) -> list[R]:
    """Runs the statement and returns its rows."""
    cursor = conn.cursor(row_factory=typed_rows(_rows_of(statement)))
    await cursor.execute(statement.text, statement.bind(params), prepare=prepare)
    return await cursor.fetchall()


async def fetch_one_async(conn: psycopg.AsyncConnection[Any], statement: Statement[P, R], params: P, *,
                          prepare: bool | None = False) -> R | None:
    """Runs the statement and returns its first row, None when it returns none."""
    rows = await fetch_async(conn, statement, params, prepare=prepare)
    return rows[0] if rows else None


async def execute_async(conn: psycopg.AsyncConnection[Any], statement: Statement[P, Any], params: P, *,
                        prepare: bool | None = False) -> None:
    """Runs a statement for its effect."""
    await conn.execute(statement.text, statement.bind(params), prepare=prepare)


async def copy_rows_async(conn: psycopg.AsyncConnection[Any], statement: Statement[NoParams, Any],
                          rows: Iterable[tuple]) -> None:
    """Runs a `COPY ... FROM STDIN` statement, sending `rows` (tuples, in the statement's column order)."""
    async with conn.cursor().copy(statement.text) as copy:
        for row in rows:
            await copy.write_row(row)


async def fetch_after_lock_async(conn: psycopg.AsyncConnection[Any], lock: Bound[Any], statement: Statement[P, R],
                                 params: P, *, prepare: bool | None = False) -> list[R]:
    """Runs `lock`, then `statement`, as one transaction sent at once, and returns the statement's
    rows. Both go out in pipeline mode before one Sync, on an autocommit connection: Postgres runs
    them as one implicit transaction, committed at the Sync (rolled back if either fails), and
    `statement` starts only once `lock` has returned, with a snapshot of its own taken then. So no
    round trip to the client runs under the lock: `statement` goes out right behind `lock`, without
    waiting for its answer, and the commit needs nothing more from the client (a lock granted at
    once may still wait the moment the client takes to send `statement`)."""
    if not conn.autocommit:
        raise TypeError("fetch_after_lock_async needs an autocommit connection (its Sync is the commit)")
    async with conn.pipeline():
        await conn.execute(lock.statement.text, lock.statement.bind(lock.params), prepare=prepare)
        cursor = conn.cursor(row_factory=typed_rows(_rows_of(statement)))
        await cursor.execute(statement.text, statement.bind(params), prepare=prepare)
    return await cursor.fetchall()


class Bound(NamedTuple, Generic[P]):
    """A statement with its parameters, for a caller that runs it later (a lock to take first)."""

    statement: Statement[P, Any]
    params: P

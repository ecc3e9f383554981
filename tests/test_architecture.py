"""The architecture's invariants, checked on the source so that later changes cannot erode them
(docs/architecture.md): no import circle, the worker package never imports the controller's, no
module over 700 lines, and rows are read by name, never by position, outside the statement layer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"queueworker": ROOT / "worker", "queueworker_controller": ROOT / "controller"}
MAX_LINES = 700
# The statement layer is the one place that talks to psycopg's cursors and builds rows.
STATEMENT_LAYER = ROOT / "worker" / "db" / "statements.py"
# What reads rows off a cursor, and what builds a row from its values by position.
CURSOR_READS = {"fetchone", "fetchall", "fetchmany"}
STATEMENT_CALLS = {"fetch", "fetch_async", "fetch_one", "fetch_one_async"}


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for top, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join([top, *parts])] = (path, is_package)
    return found


MODULES = _modules()


def _imports(module: str) -> set[str]:
    """Every module of ours that `module` imports, anywhere in it (inside functions and
    TYPE_CHECKING blocks too: an import circle of type hints is still a circle for a reader)."""
    path, is_package = MODULES[module]
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in MODULES and name != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_there_is_no_import_circle():
    graph = {module: _imports(module) for module in MODULES}
    assert _cycles(graph) == []


def test_the_worker_package_never_imports_the_controller():
    wrong = sorted(f"{module} -> {target}" for module in MODULES if module.split(".")[0] == "queueworker"
                   for target in _imports(module) if target.startswith("queueworker_controller"))
    assert wrong == []


def test_a_cycle_is_found_when_there_is_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("root", [*PACKAGES.values(), ROOT / "tests", ROOT / "bench"], ids=lambda p: p.name)
def test_no_module_is_over_700_lines(root):
    long = sorted(f"{path.relative_to(ROOT)}: {n}" for path in root.rglob("*.py")
                  if (n := len(path.read_text().splitlines())) > MAX_LINES)
    assert long == []


def _positional_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module reads database rows by position: cursor reads (which bypass the typed
    statements), rows built from values by position, rows unpacked as tuples, and values indexed
    out of a fetched row."""
    found = []

    def is_statement_call(node: ast.AST) -> bool:
        if isinstance(node, ast.Await):
            node = node.value
        return (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) in STATEMENT_CALLS)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in CURSOR_READS | {"_make"}:
            found.append((node.lineno, f".{node.func.attr}()"))
        elif isinstance(node, ast.Assign) and is_statement_call(node.value):
            # `row, = rows` takes the one row out of the list; `(a, b), = rows` unpacks the row itself.
            if any(isinstance(target, (ast.Tuple, ast.List))
                   and any(isinstance(element, (ast.Tuple, ast.List)) for element in target.elts)
                   for target in node.targets):
                found.append((node.lineno, "a fetched row unpacked"))
        elif isinstance(node, (ast.For, ast.comprehension)) and is_statement_call(node.iter) \
                and isinstance(node.target, (ast.Tuple, ast.List)):
            found.append((node.iter.lineno, "a fetched row unpacked"))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Subscript) \
                and is_statement_call(node.value.value):
            found.append((node.lineno, "a value indexed out of a fetched row"))
    return found


def test_rows_are_read_by_name_outside_the_statement_layer():
    found = []
    for module, (path, _) in sorted(MODULES.items()):
        if path == STATEMENT_LAYER:
            continue
        found += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in _positional_reads(ast.parse(path.read_text()))]
    assert found == []


def test_positional_reads_are_recognised():
    source = """
(a, b), = await conn.fetch(X, P())
row, = await conn.fetch(X, P())
for (x,) in statements.fetch(conn, X, P()):
    pass
v = (await conn.fetch(X, P()))[0][0]
r = Row._make(values)
t = cursor.fetchone()
ok = (await conn.fetch(X, P()))[0].version
"""
    assert [what for _, what in _positional_reads(ast.parse(source))] == [
        "a fetched row unpacked", "a fetched row unpacked", "a value indexed out of a fetched row", "._make()",
        ".fetchone()"]


def _wait_for_calls(tree: ast.AST) -> list[int]:
    """Where a module calls asyncio.wait_for (as `asyncio.wait_for`, or imported by name)."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "wait_for"
                 and isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio")
                or (isinstance(node.func, ast.Name) and node.func.id == "wait_for"
                    and any(isinstance(imported, ast.ImportFrom) and imported.module == "asyncio"
                            and any(alias.name == "wait_for" for alias in imported.names)
                            for imported in ast.walk(tree))))]


def test_no_module_waits_with_asyncio_wait_for():
    """On Python 3.11, asyncio.wait_for returns the result it waited for when its task is cancelled as
    that result arrives: the cancellation is lost, and a duty the shutdown cancelled goes on (a worker
    hung in its shutdown that way). `asyncio.timeout` and queueworker.events.wait_event do not."""
    found = [f"{path.relative_to(ROOT)}:{line}" for module, (path, _) in sorted(MODULES.items())
             for line in _wait_for_calls(ast.parse(path.read_text()))]
    assert found == []
    assert _wait_for_calls(ast.parse("await asyncio.wait_for(f(), 1)\n")) == [1]
    assert _wait_for_calls(ast.parse("from asyncio import wait_for\nawait wait_for(f(), 1)\n")) == [2]
    assert _wait_for_calls(ast.parse("await wait_for(f(), 1)\n")) == [], "queueworker.wait_for is not asyncio's"


def test_every_public_name_resolves_and_a_producer_loads_no_worker():
    """`queueworker/__init__` imports its names on first use: each must be where it says, and a
    producer importing the client's names must not pay for the worker runtime or its metrics."""
    import queueworker

    assert [name for name in queueworker.__all__ if getattr(queueworker, name, None) is None] == []
    assert set(queueworker.__all__) <= set(dir(queueworker))
    loaded = subprocess.run([sys.executable, "-c", (
        "import sys\nfrom queueworker import TaskSpec, enqueue, enqueue_many, get_task, wait_for\n"
        "print(sorted(m for m in sys.modules if m.startswith(('queueworker.runtime', 'queueworker.console', "
        "'queueworker.dev', 'prometheus_client'))))")], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        queueworker.nothing_here  # noqa: B018 - the lookup is the test

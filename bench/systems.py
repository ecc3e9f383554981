"""The queues under test, behind one small interface the runner drives.

Each system gets a fresh database per run. Workers are separate OS processes started with the
system's own worker entry point; the runner only enqueues, watches the database and reads the
latency probe files. Work is the same everywhere: `noop` (returns at once) for throughput and
`record` (writes enqueue-to-start latency, see bench/peers/record.py) for latency.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import psycopg

REPO = Path(__file__).resolve().parent.parent
NODE_DIR = Path(__file__).resolve().parent / "peers" / "node"

Send = Callable[[list[float]], Awaitable[None]]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


# What Dockerfile.worker copies into the image's build stage, and builds the wheel from; the extras
# its default build installs (QUEUEWORKER_EXTRAS: none).
IMAGE_SOURCES = ("pyproject.toml", "README.md", "worker", "controller", "migrations")
RUNTIME_EXTRAS: tuple[str, ...] = ()


@functools.cache
def installed_python() -> str:
    """The interpreter every queueworker worker of the benchmarks runs on: that of an environment
    made as the worker image is (Dockerfile.worker), made once per process in a directory removed at
    exit: queueworker installed from its wheel, built from IMAGE_SOURCES alone (in a copy: the
    checkout gets no build directory), its modules compiled by pip; beside it its runtime
    dependencies and nothing else (RUNTIME_EXTRAS), linked from this interpreter's environment, so
    nothing is downloaded. Not the checkout's own interpreter: its editable install's import finder,
    which no user runs, is loaded at every interpreter start and asked about every module of the
    package, and every package of the development environment is one more for importlib.metadata
    to read when psycopg asks its binary's version."""
    directory = Path(tempfile.mkdtemp(prefix="qw-bench-wheel-"))
    atexit.register(shutil.rmtree, directory, True)
    env = directory / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    source = directory / "source"
    source.mkdir()
    for name in IMAGE_SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--wheel-dir", str(directory / "wheels"), str(source)], check=True)
    [wheel] = (directory / "wheels").glob("queueworker-*.whl")
    # --ignore-installed: the checkout's editable install is neither reused nor touched.
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--ignore-installed",
                    "--disable-pip-version-check", "--prefix", str(env), str(wheel)], check=True)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_packages = Path(subprocess.run([str(python), "-c", where], check=True, capture_output=True,
                                        text=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in sorted(_runtime_entries()):
        if not (site_packages / entry).exists():
            (site_packages / entry).symlink_to(ours / entry)
    return str(python)


def _runtime_entries() -> set[str]:
    """The top-level entries of this environment's site-packages (packages, modules, their
    .dist-info, bundled libraries) of queueworker's runtime dependencies with RUNTIME_EXTRAS, and of
    theirs, as pip would install them: each requirement's markers evaluated for the extras asked of
    it."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    entries: set[str] = set()
    seen: set[tuple[str, tuple[str, ...]]] = set()
    wanted = [("queueworker", RUNTIME_EXTRAS)]
    while wanted:
        name, extras = wanted.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        dist = importlib.metadata.distribution(name)
        if name != "queueworker":
            entries.update(file.parts[0] for file in dist.files or () if file.parts[0] != "..")
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or any(requirement.marker.evaluate({"extra": extra})
                                                 for extra in ("", *extras)):
                wanted.append((requirement.name, tuple(sorted(requirement.extras))))
    return entries


class System:
    name = ""
    label = ""
    # Rows not yet finished (pending or running): the burn-down watches this fall to zero.
    remaining_sql = ""
    # Statements of a kind the fleet benchmark counts apart (heartbeat, rescue): a LIKE pattern on
    # pg_stat_statements' text of each; empty where the system's own are not known.
    statement_kinds: dict[str, str] = {}

    def unavailable(self) -> str | None:
        """None when this system can run here, else the reason it is skipped."""
        return None

    def version(self) -> str:
        return "?"

    def install(self, dsn: str) -> None:
        raise NotImplementedError

    def preload_noop(self, dsn: str, n: int) -> None:
        raise NotImplementedError

    def worker_cmd(self, dsn: str, concurrency: int) -> list[str]:
        raise NotImplementedError

    def bulk_enqueue(self, dsn: str, tasks: int, batch: int) -> float:
        """Enqueues `tasks` no-op tasks through the system's own bulk API, `batch` per call, each
        call committed on its own; the seconds the calls took (connecting excluded)."""
        raise NotImplementedError

    # The raw path: one statement, taking the timestamps as a float8[], that inserts a `record` task
    # for each into the system's table and sends the NOTIFY its own insert sends (itself, or by the
    # table's trigger), as an application in another language without the system's client would.
    raw_enqueue_sql = ""
    # Where the raw path's rows differ from what the system's own client writes.
    raw_enqueue_note = ""
    # The client call producer() makes, as the report names it.
    producer_api = ""

    def producer(self, dsn: str) -> AbstractAsyncContextManager[Send]:
        """The system's own client API: yields send(timestamps), which enqueues one `record` task
        per timestamp in one call (a producer in another language stamps the tasks itself, just
        before its call, and takes only their number)."""
        raise NotImplementedError

    @asynccontextmanager
    async def raw_producer(self, dsn: str) -> AsyncIterator[Send]:
        """The raw path (raw_enqueue_sql) on an autocommit connection, as producer() yields it."""
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            async def send(stamps: list[float]) -> None:
                await conn.execute(self.raw_enqueue_sql, (stamps,))
            yield send


@asynccontextmanager
async def subprocess_producer(cmd: list[str]) -> AsyncIterator[Send]:
    """A peer's own client API in its own language (`cmd`, a harness's `produce` mode), driven over
    stdin: each line is a count of `record` tasks to enqueue in one call, each stamped by the
    producer itself just before the call, so the pipe is not part of the latency; it prints "ready"
    once connected and "ok" when each call has returned."""
    with tempfile.TemporaryFile() as errors:
        proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=errors)

        async def answer(expected: bytes) -> None:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            if line.strip() != expected:
                errors.seek(0)
                raise RuntimeError(f"{cmd[0]} producer answered {line!r}: {errors.read()[-2000:].decode(errors='replace')}")

        try:
            await answer(b"ready")

            async def send(stamps: list[float]) -> None:
                proc.stdin.write(b"%d\n" % len(stamps))
                await proc.stdin.drain()
                await answer(b"ok")
            yield send
        finally:
            if proc.returncode is None:
                proc.stdin.close()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except asyncio.TimeoutError:
                    proc.kill()
                    await proc.wait()


class QueueWorker(System):
    name = "queueworker"
    label = "queueworker"
    producer_api = "`enqueue_many_async`"
    # Two counts, each matching a partial index: one OR'd WHERE makes the planner scan the whole
    # table, which with scenario 3's history costs the sampler a core. Delayed rows are not counted.
    remaining_sql = ("SELECT (SELECT count(*) FROM queueworker.tasks WHERE state = 'pending' AND NOT delayed) "
                     "+ (SELECT count(*) FROM queueworker.tasks WHERE state = 'running')")
    statement_kinds = {"heartbeat": "%INSERT INTO queueworker.workers%extended AS (%",  # lease.sql heartbeat
                       "rescue": "%rescued AS (%"}  # duties.sql rescue

    def version(self) -> str:
        return (f"{_version('queueworker')}, its workers installed from its wheel with its runtime dependencies "
                "alone, as the worker image installs it")

    def install(self, dsn: str) -> None:
        from queueworker.db.migrate import migrate
        migrate(dsn)

    def preload_noop(self, dsn: str, n: int) -> None:
        # One INSERT ... SELECT: the same rows ENQUEUE writes (the audit insert trigger fires too).
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO queueworker.tasks (queue, task, delayed) "
                         "SELECT 'default', 'qw.noop', false FROM generate_series(1, %s)", (n,))
            conn.execute("VACUUM ANALYZE queueworker.tasks")

    def __init__(self, processes: int | None = None):
        self.processes = processes  # `queueworker worker --processes N` (one supervisor) when set

    def worker_cmd(self, dsn: str, concurrency: int) -> list[str]:
        supervised = [] if self.processes is None else ["--processes", str(self.processes)]
        return [installed_python(), "-m", "queueworker.cli", "worker", "--builtin-tasks", "--dsn", dsn,
                "--concurrency", str(concurrency),
                "--handlers", "bench.peers.qw_handlers", "--log-level", "WARNING", *supervised]

    def bulk_enqueue(self, dsn: str, tasks: int, batch: int) -> float:
        from queueworker.client.producer import enqueue_many
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = time.perf_counter()
            for start in range(0, tasks, batch):
                enqueue_many(conn, [{"task": "qw.noop"} for _ in range(min(batch, tasks - start))])
            return time.perf_counter() - started

    # Through the producer's insert-only view, with the NOTIFY the producer's own statement sends and,
    # as it does for tasks due at once, `delayed` false (the column's default leaves a row for the
    # scheduler to admit on its next pass).
    raw_enqueue_sql = ("WITH ins AS (INSERT INTO queueworker.new_tasks (queue, task, payload, delayed) "
                       "SELECT 'default', 'bench.record', jsonb_build_object('t', t), false FROM unnest(%s::float8[]) AS t "
                       "RETURNING 1) SELECT pg_notify('queueworker', 'default') FROM (SELECT 1 FROM ins LIMIT 1) AS one")

    @asynccontextmanager
    async def producer(self, dsn: str) -> AsyncIterator[Send]:
        from queueworker.client.producer import enqueue_many_async
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            async def send(stamps: list[float]) -> None:
                await enqueue_many_async(conn, [{"task": "bench.record", "payload": {"t": t}} for t in stamps])
            yield send


class QueueWorkerSQL(QueueWorker):
    """queueworker's SQL producer API: the bulk enqueue scenario's second queueworker entry (a
    producer in any language enqueues a batch with one call of `queueworker.enqueue_many(jsonb)`)."""

    name = "queueworker-sql"
    label = "queueworker (SQL)"

    def bulk_enqueue(self, dsn: str, tasks: int, batch: int) -> float:
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = time.perf_counter()
            for start in range(0, tasks, batch):
                specs = json.dumps([{"task": "qw.noop"}] * min(batch, tasks - start))
                conn.execute("SELECT queueworker.enqueue_many(%s::jsonb)", (specs,))
            return time.perf_counter() - started


class PGQueuer(System):
    name = "pgqueuer"
    label = "PGQueuer"
    producer_api = "`Queries.enqueue` (asyncpg)"
    remaining_sql = "SELECT count(*) FROM pgqueuer"  # finished jobs leave the table (into pgqueuer_log)

    def __init__(self, batch_size: int | None = None):
        self.batch_size = batch_size  # None: half the concurrency, the most max_concurrent_tasks allows

    def _batch(self, concurrency: int) -> int:
        return self.batch_size or max(1, concurrency // 2)

    def unavailable(self) -> str | None:
        missing = [m for m in ("pgqueuer", "asyncpg") if importlib.util.find_spec(m) is None]
        return f"not installed: {', '.join(missing)} (pip install '.[bench]')" if missing else None

    def version(self) -> str:
        batch = self.batch_size or "half the concurrency"
        loop = f"uvloop {_version('uvloop')}" if importlib.util.find_spec("uvloop") else "asyncio loop"
        return f"{_version('pgqueuer')} (asyncpg {_version('asyncpg')}, {loop}, durable, batch_size={batch})"

    def _run(self, coro_fn: Callable, dsn: str, *args) -> None:
        async def main() -> None:
            import asyncpg
            from pgqueuer import Queries
            from pgqueuer.db import AsyncpgDriver
            conn = await asyncpg.connect(dsn)
            try:
                await coro_fn(Queries(AsyncpgDriver(conn)), conn, *args)
            finally:
                await conn.close()
        asyncio.run(main())

    def install(self, dsn: str) -> None:
        async def install(queries, conn) -> None:
            await queries.install()
        self._run(install, dsn)

    def preload_noop(self, dsn: str, n: int) -> None:
        async def preload(queries, conn, n: int) -> None:
            for start in range(0, n, 10000):
                k = min(10000, n - start)
                await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
            await conn.execute("VACUUM ANALYZE pgqueuer")
        self._run(preload, dsn, n)

    def worker_cmd(self, dsn: str, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "bench.peers.pgqueuer_worker", "--dsn", dsn,
                "--concurrency", str(concurrency), "--batch-size", str(self._batch(concurrency))]

    def bulk_enqueue(self, dsn: str, tasks: int, batch: int) -> float:
        seconds = []

        async def enqueue(queries, conn) -> None:
            started = time.perf_counter()
            for start in range(0, tasks, batch):
                k = min(batch, tasks - start)
                await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
            seconds.append(time.perf_counter() - started)
        self._run(enqueue, dsn)
        return seconds[0]

    # The statement trigger on the table sends the NOTIFY; Queries.enqueue also writes a log row.
    raw_enqueue_sql = ("INSERT INTO pgqueuer (priority, entrypoint, payload, status) "
                       "SELECT 0, 'record', convert_to(t::text, 'UTF8'), 'queued' FROM unnest(%s::float8[]) AS t")
    raw_enqueue_note = "no `pgqueuer_log` row"

    @asynccontextmanager
    async def producer(self, dsn: str) -> AsyncIterator[Send]:
        import asyncpg
        from pgqueuer import Queries
        from pgqueuer.db import AsyncpgDriver
        conn = await asyncpg.connect(dsn)
        queries = Queries(AsyncpgDriver(conn))
        try:
            async def send(stamps: list[float]) -> None:
                k = len(stamps)
                await queries.enqueue(["record"] * k, [repr(t).encode() for t in stamps], [0] * k)
            yield send
        finally:
            await conn.close()


class Procrastinate(System):
    name = "procrastinate"
    label = "Procrastinate"
    producer_api = "`defer_async` / `batch_defer_async`"
    remaining_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"

    def unavailable(self) -> str | None:
        return None if importlib.util.find_spec("procrastinate") else "not installed (pip install '.[bench]')"

    def version(self) -> str:
        return f"{_version('procrastinate')} (psycopg connector)"

    def install(self, dsn: str) -> None:
        from bench.peers.procrastinate_worker import make_app

        async def main() -> None:
            app = make_app(dsn)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
        asyncio.run(main())

    def preload_noop(self, dsn: str, n: int) -> None:
        # The rows `defer` writes, in one statement (batch_defer of 100k is slow and is not measured).
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
                         "SELECT 'default', 'noop', '{}'::jsonb FROM generate_series(1, %s)", (n,))
            conn.execute("VACUUM ANALYZE procrastinate_jobs")

    def worker_cmd(self, dsn: str, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "bench.peers.procrastinate_worker", "--dsn", dsn,
                "--concurrency", str(concurrency)]

    def bulk_enqueue(self, dsn: str, tasks: int, batch: int) -> float:
        from bench.peers.procrastinate_worker import make_app

        async def main() -> float:
            app = make_app(dsn, pool_size=1)
            async with app.open_async():
                task = app.tasks["noop"]
                started = time.perf_counter()
                for start in range(0, tasks, batch):
                    await task.batch_defer_async(*({} for _ in range(min(batch, tasks - start))))
                return time.perf_counter() - started
        return asyncio.run(main())

    # A row trigger sends the NOTIFY (and writes the status event) for each inserted job.
    raw_enqueue_sql = ("INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
                       "SELECT 'default', 'record', jsonb_build_object('t', t) FROM unnest(%s::float8[]) AS t")

    @asynccontextmanager
    async def producer(self, dsn: str) -> AsyncIterator[Send]:
        from bench.peers.procrastinate_worker import make_app
        app = make_app(dsn, pool_size=2)
        async with app.open_async():
            task = app.tasks["record"]

            async def send(stamps: list[float]) -> None:
                if len(stamps) == 1:
                    await task.defer_async(t=stamps[0])
                else:
                    await task.batch_defer_async(*({"t": t} for t in stamps))
            yield send


class _NodePeer(System):
    """A Node.js peer: worker and schema install are bench/peers/node/<script>.mjs."""

    script = ""
    package = ""

    def unavailable(self) -> str | None:
        if shutil.which("node") is None:
            return "node not found"
        if not (NODE_DIR / "node_modules" / self.package).is_dir():
            return f"npm package {self.package} not installed (cd bench/peers/node && npm install)"
        return None

    def version(self) -> str:
        try:
            pkg = json.loads((NODE_DIR / "node_modules" / self.package / "package.json").read_text())
            node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
            return f"{pkg['version']} (node {node})"
        except (OSError, ValueError, KeyError):
            return "?"

    def _node(self, dsn: str, *args: str) -> None:
        subprocess.run(["node", str(NODE_DIR / self.script), *args, "--dsn", dsn], check=True,
                       cwd=NODE_DIR, capture_output=True, timeout=300)

    def install(self, dsn: str) -> None:
        self._node(dsn, "install")

    def worker_cmd(self, dsn: str, concurrency: int) -> list[str]:
        return ["node", str(NODE_DIR / self.script), "work", "--dsn", dsn, "--concurrency", str(concurrency)]

    @asynccontextmanager
    async def producer(self, dsn: str) -> AsyncIterator[Send]:
        async with subprocess_producer(["node", str(NODE_DIR / self.script), "produce", "--dsn", dsn]) as send:
            yield send


class GraphileWorker(_NodePeer):
    name = "graphile-worker"
    label = "graphile-worker"
    script = "graphile.mjs"
    package = "graphile-worker"
    producer_api = "`WorkerUtils.addJob` / `addJobs` (Node)"
    remaining_sql = "SELECT count(*) FROM graphile_worker._private_jobs"  # succeeded jobs are deleted
    # Its jobs table is private (the SQL API is add_job/add_jobs, what WorkerUtils calls), so the raw
    # path is the insert and the NOTIFY that add_jobs runs, for a task the workers have registered.
    raw_enqueue_sql = ("WITH ins AS (INSERT INTO graphile_worker._private_jobs (task_id, payload) "
                       "SELECT tasks.id, json_build_object('t', t) FROM unnest(%s::float8[]) AS t, "
                       "graphile_worker._private_tasks AS tasks WHERE tasks.identifier = 'record' RETURNING 1) "
                       "SELECT pg_notify('jobs:insert', '{\"r\":' || random()::text || ',\"count\":' || count(*) || '}') "
                       "FROM ins")
    raw_enqueue_note = "into its private jobs table, which its documentation does not offer for inserts"

    def preload_noop(self, dsn: str, n: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for start in range(0, n, 10000):
                k = min(10000, n - start)
                conn.execute("SELECT graphile_worker.add_jobs(array_agg(ROW('noop', '{}'::json, NULL, NULL, NULL, "
                             "NULL, NULL, NULL)::graphile_worker.job_spec)) FROM generate_series(1, %s)", (k,))
            conn.execute("VACUUM ANALYZE graphile_worker._private_jobs")



class PgBoss(_NodePeer):
    name = "pg-boss"
    label = "pg-boss"
    script = "pgboss.mjs"
    package = "pg-boss"
    producer_api = "`send` / `insert` (Node)"
    remaining_sql = "SELECT count(*) FROM pgboss.job WHERE state IN ('created', 'retry', 'active')"
    # What pg-boss's own insert does for a `notify: true` queue: rows, then one NOTIFY.
    raw_enqueue_sql = ("WITH ins AS (INSERT INTO pgboss.job (name, data) SELECT 'record', jsonb_build_object('t', t) "
                       "FROM unnest(%s::float8[]) AS t RETURNING 1) "
                       "SELECT pg_notify('pgboss_' || left(encode(sha224('pgboss'::bytea), 'hex'), 24), 'record') "
                       "FROM (SELECT 1 FROM ins LIMIT 1) AS one")

    def preload_noop(self, dsn: str, n: int) -> None:
        self._node(dsn, "preload", "--count", str(n))



class River(System):
    """River (Go), driven by bench/peers/river/river-bench (built with `go build`, see main.go)."""

    name = "river"
    label = "River"
    producer_api = "`Client.Insert` / `InsertMany` (Go, FetchCooldown 1 ms)"
    remaining_sql = "SELECT count(*) FROM river_job WHERE state IN ('available', 'running', 'retryable')"
    # What River's own insert does: rows, then one NOTIFY per queue on <schema>.river_insert.
    raw_enqueue_sql = ("WITH ins AS (INSERT INTO river_job (args, kind, max_attempts) "
                       "SELECT jsonb_build_object('t', t), 'record', 25 FROM unnest(%s::float8[]) AS t RETURNING 1) "
                       "SELECT pg_notify(current_schema() || '.river_insert', '{\"queue\": \"default\"}') "
                       "FROM (SELECT 1 FROM ins LIMIT 1) AS one")
    binary = Path(__file__).resolve().parent / "peers" / "river" / "river-bench"

    def unavailable(self) -> str | None:
        if not self.binary.exists():
            return "not built (cd bench/peers/river && go build -o river-bench .)"
        return None

    def version(self) -> str:
        try:
            for line in (self.binary.parent / "go.mod").read_text().splitlines():
                if "github.com/riverqueue/river " in line:
                    return line.split()[-1] + " (riverpgxv5, FetchCooldown 1 ms, otherwise defaults)"
        except OSError:
            pass
        return "?"

    def install(self, dsn: str) -> None:
        subprocess.run([str(self.binary), "install", "--dsn", dsn], check=True, capture_output=True, timeout=120)

    def preload_noop(self, dsn: str, n: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO river_job (args, kind, max_attempts) "
                         "SELECT '{}'::jsonb, 'noop', 25 FROM generate_series(1, %s)", (n,))
            conn.execute("VACUUM ANALYZE river_job")

    def worker_cmd(self, dsn: str, concurrency: int) -> list[str]:
        return [str(self.binary), "work", "--dsn", dsn, "--concurrency", str(concurrency)]

    @asynccontextmanager
    async def producer(self, dsn: str) -> AsyncIterator[Send]:
        async with subprocess_producer([str(self.binary), "produce", "--dsn", dsn]) as send:
            yield send



ALL: dict[str, Callable[[], System]] = {
    "queueworker": QueueWorker,
    "pgqueuer": PGQueuer,
    "procrastinate": Procrastinate,
    "graphile-worker": GraphileWorker,
    "pg-boss": PgBoss,
    "river": River,
}

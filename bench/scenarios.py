"""The scenarios, each for one system on one fresh database: burn-down, latency, idle cost.

Throughput is read from the database: a sampler records (clock_timestamp(), rows not finished)
every 0.5 s (0.1 s for small runs), and the rate is taken between 5% and 95% drained, so worker
start-up and the tail are outside the window. Every system is measured the same way.
"""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil
import psycopg

from bench.systems import REPO, Send, System

LOG_DIR = tempfile.mkdtemp(prefix="qw-bench-logs-")


@dataclass
class Workers:
    procs: list[subprocess.Popen]
    lat_file: str
    logs: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, system: System, dsn: str, count: int, concurrency: int) -> Workers:
        lat_file = tempfile.mktemp(prefix=f"qw-bench-lat-{system.name}-")
        env = dict(os.environ, BENCH_LAT_FILE=lat_file, PYTHONPATH=str(REPO))
        procs, logs = [], []
        for i in range(count):
            log_path = os.path.join(LOG_DIR, f"{system.name}-{int(time.time() * 1000)}-{i}.log")
            with open(log_path, "w") as log:
                procs.append(subprocess.Popen(system.worker_cmd(dsn, concurrency), stdout=log, stderr=log,
                                              cwd=REPO, env=env, start_new_session=True))
            logs.append(log_path)
        return cls(procs, lat_file, logs)

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs):
            if proc.poll() is not None:
                tail = open(log).read()[-2000:]
                raise RuntimeError(f"worker exited with {proc.returncode}: {tail}")

    def rss_mb(self) -> list[float]:
        """Per started process, with its live descendants (`queueworker worker --processes N`)."""
        out = []
        for proc in self.procs:
            try:
                out.append(sum(p.memory_info().rss for p in _tree(proc.pid)) / 2**20)
            except psutil.Error:
                out.append(float("nan"))
        return out

    def latencies(self) -> list[float]:
        values: list[float] = []
        for path in glob.glob(self.lat_file + ".*"):
            with open(path) as f:
                values += [float(line) for line in f if line.strip()]
        return values

    def clear_latencies(self) -> None:
        for path in glob.glob(self.lat_file + ".*"):
            with open(path, "w"):
                pass

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        killed = []
        for proc, log in zip(self.procs, self.logs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                killed.append(log)
        if killed:  # a worker that does not stop is a bug the measure must not hide
            print(f"warning: {len(killed)} of {len(self.procs)} worker processes did not stop within 10 s of "
                  f"SIGTERM and were killed; their logs: {', '.join(killed)}", file=sys.stderr)
        for path in glob.glob(self.lat_file + ".*"):
            os.unlink(path)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _crossing(samples: list[tuple[float, int]], level: float) -> float | None:
    """Interpolated time at which `remaining` first fell to `level` or below."""
    prev = None
    for t, r in samples:
        if r <= level:
            if prev is None or prev[1] == r:
                return t
            t0, r0 = prev
            return t0 + (t - t0) * (r0 - level) / (r0 - r)
        prev = (t, r)
    return None


TAIL_TICK = 0.02
POSTMASTER_PID: int | None = None  # set by watch_postgres: Postgres CPU time is read from its children


def watch_postgres(data_dir: Path) -> None:
    """Reads Postgres's CPU time from now on from the children of the server whose data directory
    is `data_dir` (postgres_cpu); NaN when its postmaster cannot be found."""
    global POSTMASTER_PID
    try:
        POSTMASTER_PID = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        POSTMASTER_PID = None


def postgres_cpu() -> float:
    """CPU seconds Postgres's processes (the watched postmaster's children) have spent so far."""
    if POSTMASTER_PID is None:
        return float("nan")
    total = 0.0
    try:
        for child in psutil.Process(POSTMASTER_PID).children():
            try:
                t = child.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    except psutil.Error:
        return float("nan")
    return total


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def processes_cpu(procs: list[subprocess.Popen]) -> float:
    """CPU seconds of the started processes, their live descendants and the children they reaped."""
    total = 0.0
    for proc in procs:
        try:
            for process in _tree(proc.pid):
                t = process.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            return float("nan")
    return total


def burn_down(system: System, dsn: str, tasks: int, processes: int, concurrency: int,
              cap_seconds: float, timeout: float = 900) -> dict:
    """Draining `tasks` pre-enqueued no-op tasks: the whole drain (from starting the worker
    processes to the last task finished: what a user waits for) and the steady rate between 5% and
    95% drained; also the workers' peak RSS under load and the CPU per task spent by the workers and
    by Postgres from the 5% mark on."""
    system.preload_noop(dsn, tasks)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")  # every run starts from a clean checkpoint (same full-page writes)
    spawned = time.time()  # the database's clock_timestamp() reads the same clock
    workers = Workers.start(system, dsn, processes, concurrency)
    samples: list[tuple[float, int]] = []
    vacuum_samples = 0
    # Counting 100k unfinished rows costs Postgres ~30 ms, so big runs are sampled every 0.5 s
    # (about 5% of one core, falling as the queue drains); the crossings are interpolated. The last
    # 5% are cheap to count and are sampled every 20 ms, so the end of the drain is read to ~20 ms.
    coarse_tick = 0.5 if tasks >= 20_000 else 0.1
    cpu_mark: tuple[int, float, float] | None = None
    rss_peak = [0.0] * processes
    capped = False
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET max_parallel_workers_per_gather = 0")  # the sampler keeps to one backend
            started = time.monotonic()
            while True:
                now, remaining, vacuuming = conn.execute(
                    f"SELECT extract(epoch FROM clock_timestamp())::float8, ({system.remaining_sql}), "
                    "EXISTS (SELECT 1 FROM pg_stat_progress_vacuum WHERE datname = current_database())").fetchone()
                samples.append((now, remaining))
                vacuum_samples += vacuuming
                if cpu_mark is None and remaining <= tasks * 0.95:
                    # CPU is counted from the 5% mark on: interpreter start-up is not per-task cost.
                    cpu_mark = (remaining, processes_cpu(workers.procs), postgres_cpu())
                rss_peak = [max(a, b) for a, b in zip(rss_peak, workers.rss_mb())]
                if remaining == 0:
                    break
                t5 = _crossing(samples, tasks * 0.95)
                if t5 is not None and now - t5 > cap_seconds and remaining > tasks * 0.05:
                    capped = True
                    break
                if time.monotonic() - started > timeout:
                    raise RuntimeError(f"{system.name}: burn-down did not finish in {timeout}s ({remaining} left)")
                workers.check_alive()
                time.sleep(TAIL_TICK if remaining <= tasks * 0.05 else coarse_tick)
            worker_cpu = processes_cpu(workers.procs)
    finally:
        pg_cpu_end = postgres_cpu()
        workers.stop()
    t_start = _crossing(samples, tasks * 0.95)
    if capped:
        t_end, done = samples[-1][0], tasks * 0.95 - samples[-1][1]
    else:
        t_end, done = _crossing(samples, tasks * 0.05), tasks * 0.9
    rate = done / (t_end - t_start) if t_start is not None and t_end and t_end > t_start else float("nan")
    if cpu_mark is not None:
        done_all = cpu_mark[0] - samples[-1][1]
        worker_cpu -= cpu_mark[1]
        pg_cpu = pg_cpu_end - cpu_mark[2]
    else:
        done_all, pg_cpu = 0, float("nan")
    drained = None if capped or samples[-1][1] else samples[-1][0] - spawned
    return {"tasks_per_s": rate, "capped": capped, "rss_load_mb": max(rss_peak),
            "drain_seconds": float("nan") if drained is None else drained,
            "drain_tasks_per_s": float("nan") if drained is None else tasks / drained,
            "to_5pct_seconds": float("nan") if t_start is None else t_start - spawned,
            "vacuum_active": vacuum_samples / len(samples),
            "worker_cpu_us_per_task": worker_cpu * 1e6 / done_all if done_all else float("nan"),
            "pg_cpu_us_per_task": pg_cpu * 1e6 / done_all if done_all else float("nan")}


async def _produce(producer: Callable[[str], AbstractAsyncContextManager[Send]], dsn: str, stamps_per_tick: int,
                   ticks: int, interval: float) -> int:
    sent = 0
    async with producer(dsn) as send:
        next_at = time.monotonic()
        for _ in range(ticks):
            now = time.time()
            await send([now] * stamps_per_tick)
            sent += stamps_per_tick
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
    return sent


def _wait_for(workers: Workers, count: int, timeout: float) -> list[float]:
    deadline = time.monotonic() + timeout
    while True:
        values = workers.latencies()
        if len(values) >= count or time.monotonic() > deadline:
            return values
        workers.check_alive()
        time.sleep(0.05)


# The two ways the latency scenario enqueues, each with the prefix of its result keys: the system's own
# client API, and a raw INSERT plus the NOTIFY its own insert sends (System.raw_enqueue_sql).
ENQUEUE_PATHS = {"api": "", "raw": "raw_"}


def latency(system: System, dsn: str, processes: int, concurrency: int, idle_samples: int,
            load_rate: int, load_seconds: float, paths: tuple[str, ...] = tuple(ENQUEUE_PATHS)) -> dict:
    """Enqueue-to-start latency, for each enqueue path in `paths`: single tasks to idle workers (the
    wake-up path), then a fixed enqueue rate (ticks of 10 ms) while the workers are busy with it."""
    workers = Workers.start(system, dsn, processes, concurrency)
    result: dict = {}
    try:
        for path in paths:
            producer = system.producer if path == "api" else system.raw_producer
            # Warm up: wait until a probe task has run, then let the other process settle too.
            probe_deadline = time.monotonic() + 60
            workers.clear_latencies()
            while not workers.latencies():
                asyncio.run(_produce(producer, dsn, 1, 1, 0))
                _wait_for(workers, 1, 1.0)
                if time.monotonic() > probe_deadline:
                    raise RuntimeError(f"{system.name}: workers never ran a probe task enqueued by the {path} path")
            time.sleep(2.0)
            workers.clear_latencies()
            asyncio.run(_produce(producer, dsn, 1, idle_samples, 0.05))
            idle = _wait_for(workers, idle_samples, 60)
            time.sleep(1.0)
            workers.clear_latencies()
            tick = 0.01
            per_tick = max(1, round(load_rate * tick))
            ticks = int(load_seconds / tick)
            sent = asyncio.run(_produce(producer, dsn, per_tick, ticks, tick))
            loaded = _wait_for(workers, sent, 120)
            prefix = ENQUEUE_PATHS[path]
            result.update({f"{prefix}idle_p50": percentile(idle, 50), f"{prefix}idle_p99": percentile(idle, 99),
                           f"{prefix}idle_n": len(idle), f"{prefix}load_p50": percentile(loaded, 50),
                           f"{prefix}load_p99": percentile(loaded, 99), f"{prefix}load_n": len(loaded),
                           f"{prefix}load_sent": sent, f"{prefix}load_rate": per_tick / tick})
            time.sleep(1.0)
    finally:
        workers.stop()
    return result


def notify_floor(dsn: str, samples: int, interval: float = 0.05) -> dict:
    """The machine's floor for the idle path, with no queue at all: one connection sends a NOTIFY
    (autocommit) every `interval`, another, idle in LISTEN, receives it. Twice: a bare
    `SELECT pg_notify(...)` (a transaction that writes nothing commits without a WAL flush), and the
    same NOTIFY from a statement that also inserts a row, whose commit waits for the disk as any
    durable enqueue must. An idle enqueue-to-start needs at least the second plus one claim."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor_rows (id bigserial PRIMARY KEY)")
    bare = _notify_round_trips(dsn, samples, interval, "SELECT pg_notify('bench_floor', %s)")
    durable = _notify_round_trips(dsn, samples, interval, "WITH row AS (INSERT INTO bench_floor_rows DEFAULT "
                                  "VALUES RETURNING 1) SELECT pg_notify('bench_floor', %s) FROM row")
    return {"notify_p50": percentile(bare[0], 50), "notify_p99": percentile(bare[0], 99),
            "call_p50": percentile(bare[1], 50), "durable_p50": percentile(durable[0], 50),
            "durable_p99": percentile(durable[0], 99), "durable_call_p50": percentile(durable[1], 50)}


def _notify_round_trips(dsn: str, samples: int, interval: float, statement: str) -> tuple[list[float], list[float]]:
    """(send → received ms, the sender's call ms) for `samples` notifications sent by `statement`."""
    received: list[float] = []

    def listen(ready: threading.Event) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("LISTEN bench_floor")
            ready.set()
            for note in conn.notifies(timeout=samples * interval + 10):
                if note.payload == "stop":
                    return
                received.append((time.time() - float(note.payload)) * 1000)

    ready = threading.Event()
    listener = threading.Thread(target=listen, args=(ready,), daemon=True)
    listener.start()
    ready.wait(10)
    calls = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(samples):
            sent = time.time()
            conn.execute(statement, (repr(sent),))
            calls.append((time.time() - sent) * 1000)
            time.sleep(interval)
        conn.execute("SELECT pg_notify('bench_floor', 'stop')")
    listener.join(15)
    return received, calls


def idle_cost(system: System, dsn: str, admin_dsn: str, processes: int, concurrency: int,
              settle: float, window: float) -> dict:
    """Statements/s per idle worker (pg_stat_statements calls in this database) and idle RSS."""
    workers = Workers.start(system, dsn, processes, concurrency)
    try:
        time.sleep(settle)
        workers.check_alive()
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
            conn.execute("SELECT pg_stat_statements_reset()")
            conn.execute("SELECT pg_stat_clear_snapshot()")
            xact0 = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                                 (dbname,)).fetchone()[0]
            t0 = time.monotonic()
            time.sleep(window)
            calls = conn.execute("""
                SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s
                JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s""", (dbname,)).fetchone()[0]
            top = conn.execute("""
                SELECT s.calls, left(regexp_replace(s.query, '\\s+', ' ', 'g'), 70) FROM pg_stat_statements s
                JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s ORDER BY s.calls DESC LIMIT 5""",
                               (dbname,)).fetchall()
            elapsed = time.monotonic() - t0
            conn.execute("SELECT pg_stat_clear_snapshot()")
            time.sleep(0.6)  # pg_stat_database is flushed by backends at most every ~0.5-1 s
            xact1 = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                                 (dbname,)).fetchone()[0]
        rss = workers.rss_mb()
        workers.check_alive()
    finally:
        workers.stop()
    return {"stmts_per_s_per_worker": float(calls) / elapsed / processes,
            "xacts_per_s_per_worker": float(xact1 - xact0) / elapsed / processes,
            "rss_idle_mb": statistics.mean(rss), "top_statements": [[int(c), q] for c, q in top]}


class ActivitySampler:
    """Samples one database's sessions from another connection every `interval` seconds, on a
    thread: how many wait for a lock (pg_stat_activity), how many lock requests are not granted
    (pg_locks), and how many connections it has."""

    def __init__(self, admin_dsn: str, dbname: str, interval: float = 0.05):
        self._admin_dsn, self._dbname, self._interval = admin_dsn, dbname, interval
        self.samples: list[tuple[int, int, int]] = []  # (waiting for a lock, ungranted locks, connections)
        self.waited_for: Counter[str] = Counter()  # per lock type (`extend`, `transactionid`, ...): sessions seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ActivitySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self._admin_dsn, autocommit=True) as conn:
            while not self._stop.wait(self._interval):
                waiting, ungranted, connections, kinds = conn.execute("""
                    SELECT count(*) FILTER (WHERE a.wait_event_type = 'Lock'),
                           (SELECT count(*) FROM pg_locks l JOIN pg_stat_activity w ON w.pid = l.pid
                            WHERE NOT l.granted AND w.datname = %(db)s),
                           count(*),
                           coalesce(array_agg(a.wait_event) FILTER (WHERE a.wait_event_type = 'Lock'), '{}')
                    FROM pg_stat_activity a WHERE a.datname = %(db)s AND a.pid <> pg_backend_pid()""",
                                                                   {"db": self._dbname}).fetchone()
                self.samples.append((waiting, ungranted, connections))
                self.waited_for.update(kinds)

    def summary(self) -> dict:
        if not self.samples:
            return {"lock_waits_mean": float("nan"), "lock_waits_max": 0, "lock_wait_share": float("nan"),
                    "ungranted_max": 0, "connections_max": 0}
        waiting = [s[0] for s in self.samples]
        return {"lock_waits_mean": statistics.mean(waiting), "lock_waits_max": max(waiting),
                "lock_wait_share": sum(1 for w in waiting if w) / len(waiting),
                "ungranted_max": max(s[1] for s in self.samples),
                "connections_max": max(s[2] for s in self.samples), "lock_waits_by_type": dict(self.waited_for)}


def _statement_calls(admin_dsn: str, dbname: str, kinds: dict[str, str]) -> dict[str, int]:
    """Statements run in `dbname` since pg_stat_statements was last reset: all, and per kind."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        return {kind: conn.execute("""
            SELECT coalesce(sum(s.calls), 0)::bigint FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
            WHERE d.datname = %s AND s.query LIKE %s""", (dbname, pattern)).fetchone()[0]
                for kind, pattern in {"all": "%", **kinds}.items()}


def fleet(system: System, dsn: str, admin_dsn: str, tasks: int, processes: int, concurrency: int,
          cap_seconds: float, idle_samples: int, load_rate: int, load_seconds: float) -> dict:
    """Many worker processes against one Postgres: the burn-down of `tasks` no-op tasks (whole
    drain, start-up counted) while the database's sessions are sampled for lock waits and its
    statements counted (all, and the system's heartbeats and rescues), then the latency scenario
    with the same fleet started anew."""
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
    started = time.monotonic()
    with ActivitySampler(admin_dsn, dbname) as sampler:
        drained = burn_down(system, dsn, tasks, processes, concurrency, cap_seconds)
    seconds = time.monotonic() - started
    calls = _statement_calls(admin_dsn, dbname, system.statement_kinds)
    result = {**drained, **sampler.summary(), "statements_per_s": calls.pop("all") / seconds,
              **{f"{kind}s_per_s": count / seconds for kind, count in calls.items()}}
    return {**result, **latency(system, dsn, processes, concurrency, idle_samples, load_rate, load_seconds,
                                ("api",))}

"""The benchmark runner: `python -m bench [--quick] [--out BENCHMARKS.md]`.

Starts its own durable Postgres (pg_stat_statements loaded), runs every scenario for every
installed system with the same task counts, worker processes and concurrency, alternating the
systems' order from run to run, and writes BENCHMARKS.md (table, plot, machine, method) plus
the raw results as JSON beside the plot. The fleet scenario (`--scenarios fleet`, shapes from
`--fleet-shapes 64x8,16x32`) runs many worker processes at once; with it, the server allows
FLEET_MAX_CONNECTIONS connections.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg

from bench import enqueue, graphs, history, report, runs, scenarios, startup
from bench.report import SWEEP_EXCLUDED
from bench.systems import ALL, QueueWorkerSQL, System


@dataclass
class Config:
    tasks: int = 100_000
    runs: int = 3
    processes: int = 2
    concurrency: int = 100
    burn_cap_seconds: float = 30.0
    idle_samples: int = 200
    load_rate: int = 1000
    load_seconds: float = 5.0
    idle_settle: float = 15.0
    idle_window: float = 30.0
    history_finished: int = 10_000_000
    history_delayed: int = 1_000_000
    history_tasks: int = 300_000  # long enough for autovacuum cycles on the big table to show
    history_runs: int = 3
    ceiling_runs: int = 3
    fanin_partitions: int = 10_000
    fanin_runs: int = 3
    flow_runs: int = 3
    # Dependency graphs: one dependent of this many prerequisites, this many dependents of one
    # prerequisite, a chain of this many stages.
    graph_prerequisites: int = 1_000
    graph_dependents: int = 20_000
    graph_chain: int = 10_000
    graph_runs: int = 3
    # The whole-drain sweep: the burn-down at these concurrencies (100 is the burn-down itself), for
    # the systems fast enough to drain 100k tasks in seconds.
    sweep_concurrency: tuple[int, ...] = (16, 32, 64, 200)
    # `queueworker worker --processes N`: one supervised pod-like process tree at each N.
    supervised_processes: tuple[int, ...] = (1, 2)
    enqueue_tasks: int = 100_000
    startup_runs: int = 10
    # The fleet: this many worker processes at this concurrency each, against one Postgres whose
    # max_connections is raised to FLEET_MAX_CONNECTIONS.
    fleet_shapes: tuple[tuple[int, int], ...] = ((64, 8), (16, 32))
    fleet_tasks: int = 20_000
    fleet_runs: int = 1

    @classmethod
    def quick(cls) -> Config:
        return cls(tasks=300, runs=1, burn_cap_seconds=10, idle_samples=10, load_rate=200, load_seconds=1.0,
                   idle_settle=2.0, idle_window=2.0, history_finished=3000, history_delayed=1000,
                   history_tasks=300, history_runs=1, ceiling_runs=1, fanin_partitions=50, fanin_runs=1, flow_runs=1,
                   sweep_concurrency=(16,), enqueue_tasks=3000, startup_runs=1, graph_prerequisites=50,
                   graph_dependents=200, graph_chain=50, graph_runs=1, fleet_shapes=((3, 2),), fleet_tasks=200)


SCENARIOS = ("burn", "sweep", "processes", "enqueue", "startup", "latency", "idle", "history", "ceiling", "fanin",
             "flow", "graphs", "fleet")
# Enough for the largest fleet of any system here (a graphile-worker process keeps a pool of 10).
FLEET_MAX_CONNECTIONS = 1_000

HISTORY_AUTOVACUUM_NAPTIME = "5s"


class Runner:
    def __init__(self, config: Config, systems: list[System], scenario_names: list[str], log=print):
        self.config = config
        self.systems = systems
        self.scenarios = scenario_names
        self.log = log
        self.results: dict = {"burn": {}, "sweep": {}, "processes": {}, "enqueue": {}, "startup": {}, "latency": {},
                              "idle": {}, "history": {}, "ceiling": [], "fanin": [], "flow": [], "graphs": [],
                              "fleet": {}, "errors": []}
        self._db_seq = 0

    def run(self) -> dict:
        from queueworker.dev.localpg import LocalPostgres
        server = LocalPostgres(durable=True, extra_settings={
            "shared_preload_libraries": "'pg_stat_statements'", "pg_stat_statements.track": "'top'",
            "max_wal_size": "'4GB'", **({"max_connections": str(FLEET_MAX_CONNECTIONS)}
                                        if "fleet" in self.scenarios else {})})
        self.admin_dsn = server.start()
        self.pg_bin = server.bin_dir
        scenarios.watch_postgres(server.data_dir)
        try:
            with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                self.results["postgres"] = conn.execute("SHOW server_version").fetchone()[0]
                self.results["pg_settings"] = dict(conn.execute(
                    "SELECT name, CASE WHEN unit = '8kB' THEN pg_size_pretty(setting::bigint * 8192) ELSE setting END "
                    "FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', "
                    "'shared_buffers', 'max_connections', 'wal_level', 'full_page_writes')").fetchall())
            self.results["load_before"] = os.getloadavg()
            started = time.monotonic()
            for name in ("burn", "sweep", "processes", "enqueue", "startup", "latency", "idle", "ceiling", "history",
                         "fanin", "flow", "graphs", "fleet"):
                if name in self.scenarios:
                    self.log(f"== scenario {name}")
                    getattr(self, f"_{name}")()
            self.results["load_after"] = os.getloadavg()
            self.results["seconds"] = time.monotonic() - started
        finally:
            server.destroy()
        return self.results

    # -- helpers ---------------------------------------------------------------------------

    def _fresh_db(self, system: System) -> str:
        self._db_seq += 1
        name = f"b_{system.name.replace('-', '_')}_{self._db_seq}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        dsn = self.admin_dsn.rsplit("/", 1)[0] + "/" + name  # a URL: asyncpg takes no key=value DSNs
        try:
            system.install(dsn)
        except BaseException as exc:
            self._drop_db(dsn)
            detail = getattr(exc, "stderr", None)
            if detail:
                raise RuntimeError(f"{system.name} install failed: {str(detail)[-1500:]}") from exc
            raise
        return dsn

    def _drop_db(self, dsn: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _alternating(self, scenario: str, runs: int, fn, systems: list[System] | None = None,
                     store: dict | None = None) -> None:
        """Runs fn(system, dsn) `runs` times per system, rotating the order every round; results go
        to store[system name] (default: the scenario's results)."""
        systems = self.systems if systems is None else systems
        store = self.results[scenario] if store is None else store
        for round_no in range(runs):
            shift = round_no % len(systems)
            for system in systems[shift:] + systems[:shift]:
                dsn = None
                try:
                    dsn = self._fresh_db(system)
                    result = fn(system, dsn)
                    self.log(f"   {scenario} {system.name} run {round_no + 1}: {_brief(result)}")
                    store.setdefault(system.name, []).append(result)
                except Exception as exc:  # noqa: BLE001 - one peer failing must not end the run
                    self.log(f"   {scenario} {system.name} run {round_no + 1} FAILED: {exc}")
                    self.results["errors"].append({"scenario": scenario, "system": system.name,
                                                   "error": f"{type(exc).__name__}: {exc}"[:2000]})
                    traceback.print_exc(file=sys.stderr)
                finally:
                    if dsn:
                        self._drop_db(dsn)

    # -- scenarios -------------------------------------------------------------------------

    def _burn(self) -> None:
        c = self.config
        self._alternating("burn", c.runs, lambda s, dsn: scenarios.burn_down(
            s, dsn, c.tasks, c.processes, c.concurrency, c.burn_cap_seconds))

    def _sweep(self) -> None:
        """The burn-down at other concurrencies (per worker process), same method."""
        c = self.config
        systems = [s for s in self.systems if s.name not in SWEEP_EXCLUDED]
        for concurrency in c.sweep_concurrency:
            self.log(f"   concurrency {concurrency}")
            self._alternating(f"sweep {concurrency}", c.runs, lambda s, dsn: scenarios.burn_down(
                s, dsn, c.tasks, c.processes, concurrency, c.burn_cap_seconds), systems,
                self.results["sweep"].setdefault(str(concurrency), {}))

    def _processes(self) -> None:
        """The burn-down with one `queueworker worker --processes N` (a pod's command) instead of
        separate processes, at each N: how far one pod scales with the cores it has."""
        c = self.config
        supervised = [ALL["queueworker"](processes) for processes in c.supervised_processes]
        for system in supervised:
            system.name = f"processes-{system.processes}"  # a database name too
        self._alternating("processes", c.runs, lambda s, dsn: scenarios.burn_down(
            s, dsn, c.tasks, 1, c.concurrency, c.burn_cap_seconds), supervised)

    def _latency(self) -> None:
        c = self.config
        self._floor()
        self._alternating("latency", c.runs, lambda s, dsn: scenarios.latency(
            s, dsn, c.processes, c.concurrency, c.idle_samples, c.load_rate, c.load_seconds))
        self._floor()

    def _floor(self) -> None:
        floor = scenarios.notify_floor(self.admin_dsn, self.config.idle_samples)
        self.log(f"   latency floor (bare NOTIFY round trip): {_brief(floor)}")
        self.results.setdefault("latency_floor", []).append(floor)

    def _idle(self) -> None:
        c = self.config
        self._alternating("idle", 1, lambda s, dsn: scenarios.idle_cost(
            s, dsn, self.admin_dsn, c.processes, c.concurrency, c.idle_settle, c.idle_window))

    def _ceiling(self) -> None:
        c = self.config
        qw = next((s for s in self.systems if s.name == "queueworker"), None) or ALL["queueworker"]()
        pgbench = history.find_pgbench(self.pg_bin)
        if pgbench is None:
            self.results["skipped_scenarios"] = {"ceiling": "pgbench not found"}
            self.log("   ceiling skipped: pgbench not found")
            return
        for round_no in range(c.ceiling_runs):
            for clients, limit in ((2, c.concurrency), (4, c.concurrency // 2)):
                result = self._on_fresh_db(qw, "ceiling", "pgbench", lambda dsn: history.ceiling(
                    dsn, c.tasks, clients, limit, pgbench))
                if result:
                    self.log(f"   ceiling {clients} clients x limit {limit}: {result['tasks_per_s']:.0f} tasks/s")
                    self.results["ceiling"].append(result)

    def _history(self) -> None:
        """queueworker's claim throughput and idle claim cost: empty table vs big history."""
        c = self.config
        qw = ALL["queueworker"]()
        big = self._fresh_db(qw)
        # A long-running queue is vacuumed continuously; at the default 1 min naptime a 15 s run
        # may or may not meet a vacuum, so wake the launcher often enough that every run does.
        self._set_server("autovacuum_naptime", HISTORY_AUTOVACUUM_NAPTIME)
        try:
            self.log(f"   building history: {c.history_finished} finished + {c.history_delayed} delayed rows")
            self.results["history"]["build_seconds"] = history.build_history(big, c.history_finished,
                                                                             c.history_delayed)
            for round_no in range(c.history_runs):
                for label in (("empty", "history") if round_no % 2 == 0 else ("history", "empty")):
                    dsn = big if label == "history" else self._fresh_db(qw)
                    try:
                        idle = history.idle_claim_cost(dsn)
                        result = scenarios.burn_down(qw, dsn, c.history_tasks, c.processes, c.concurrency,
                                                     c.burn_cap_seconds)
                        result.update(idle_claim_ms=idle["claim_ms"], idle_claim_buffers=idle["buffers"])
                        self.log(f"   history {label} run {round_no + 1}: {_brief(result)}")
                        self.results["history"].setdefault(label, []).append(result)
                    except Exception as exc:  # noqa: BLE001
                        self.log(f"   history {label} FAILED: {exc}")
                        self.results["errors"].append({"scenario": "history", "system": label, "error": str(exc)})
                    finally:
                        if dsn is not big:
                            self._drop_db(dsn)
        finally:
            self._drop_db(big)
            self._set_server("autovacuum_naptime", None)

    def _fanin(self) -> None:
        """A run of N partitions against N plain tasks, alternating which goes first."""
        c = self.config
        qw = ALL["queueworker"]()
        for round_no in range(c.fanin_runs):
            for with_run in ((True, False) if round_no % 2 == 0 else (False, True)):
                result = self._on_fresh_db(qw, "fanin", "queueworker", lambda dsn: runs.fan_in(
                    qw, dsn, c.fanin_partitions, c.processes, c.concurrency, with_run))
                if result:
                    self.log(f"   fanin {result['kind']} run {round_no + 1}: {_brief(result)}")
                    self.results["fanin"].append(result)

    def _flow(self) -> None:
        """Burn-down of a queue with flow control that never binds (a rate of 1,000,000/s with as big
        a burst, so every claim goes through CLAIM_LIMITED), against the same queue without."""
        c = self.config
        qw = ALL["queueworker"]()
        for round_no in range(c.flow_runs):
            for limited in ((True, False) if round_no % 2 == 0 else (False, True)):
                def measure(dsn: str, limited: bool = limited) -> dict:
                    if limited:
                        runs.loose_limit(dsn)
                    result = scenarios.burn_down(qw, dsn, c.tasks, c.processes, c.concurrency, c.burn_cap_seconds)
                    return {**result, "limited": limited}
                result = self._on_fresh_db(qw, "flow", "queueworker", measure)
                if result:
                    self.log(f"   flow {'limited' if limited else 'plain'} run {round_no + 1}: {_brief(result)}")
                    self.results["flow"].append(result)

    def _graphs(self) -> None:
        """A wide fan-in, a wide fan-out and a long chain (bench/graphs.py), each on a fresh database."""
        c = self.config
        qw = ALL["queueworker"]()
        for round_no in range(c.graph_runs):
            measured = {
                "fan-in": lambda dsn: graphs.fan_in(dsn, c.graph_prerequisites),
                "fan-out": lambda dsn: graphs.fan_out(dsn, c.graph_dependents),
                "chain": lambda dsn: graphs.chain(dsn, c.graph_chain)}
            for kind, measure in measured.items():
                result = self._on_fresh_db(qw, "graphs", "queueworker", measure)
                if result:
                    self.log(f"   graphs {kind} run {round_no + 1}: {_brief(result)}")
                    self.results["graphs"].append({"kind": kind, **result})

    def _fleet(self) -> None:
        """Each fleet shape in turn, every system alternating: results per shape ("64x8") and system."""
        c = self.config
        for processes, concurrency in c.fleet_shapes:
            self._alternating("fleet", c.fleet_runs, lambda s, dsn, p=processes, n=concurrency: scenarios.fleet(
                s, dsn, self.admin_dsn, c.fleet_tasks, p, n, c.burn_cap_seconds, c.idle_samples, c.load_rate,
                c.load_seconds), store=self.results["fleet"].setdefault(f"{processes}x{concurrency}", {}))

    def _enqueue(self) -> None:
        """Each system's own bulk enqueue API (systems without one are skipped); queueworker's through
        its SQL producer function too."""
        c = self.config
        able = [s for s in self.systems if type(s).bulk_enqueue is not System.bulk_enqueue]
        able += [QueueWorkerSQL() for s in able if s.name == "queueworker"]
        systems, self.systems = self.systems, able
        try:
            self._alternating("enqueue", c.runs, lambda s, dsn: enqueue.enqueue_rate(s, dsn, c.enqueue_tasks))
        finally:
            self.systems = systems

    def _startup(self) -> None:
        """Process start to first claim of a waiting task, for the systems bench/startup.py knows."""
        for system in [s for s in self.systems if s.name in startup.SYSTEMS]:
            result = self._on_fresh_db(system, "startup", system.name, lambda dsn: startup.startup_time(
                dsn, self.config.startup_runs, system))
            if result:
                self.log(f"   startup {system.name}: {_brief(result)}")
                self.results["startup"][system.name] = result

    def _on_fresh_db(self, system: System, scenario: str, label: str, measure) -> dict | None:
        """measure(dsn) on a fresh database, dropped afterwards; a failure is logged and recorded
        (None), so one failed measurement does not end the others."""
        dsn = self._fresh_db(system)
        try:
            return measure(dsn)
        except Exception as exc:  # noqa: BLE001
            self.log(f"   {scenario} {label} FAILED: {exc}")
            self.results["errors"].append({"scenario": scenario, "system": label, "error": str(exc)})
            return None
        finally:
            self._drop_db(dsn)

    def _set_server(self, setting: str, value: str | None) -> None:
        """ALTER SYSTEM SET (or RESET when value is None) and reload."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            if value is None:
                conn.execute(f"ALTER SYSTEM RESET {setting}")
            else:
                conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")


def _brief(result: dict) -> str:
    return ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()
                     if not isinstance(v, (list, dict)))


def _fleet_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """`64x8,16x32` as ((64, 8), (16, 32)); ValueError for anything else (none, a zero, a missing part)."""
    shapes = tuple((int(p), int(c)) for p, c in (shape.strip().split("x") for shape in text.split(",") if shape.strip()))
    if not shapes or min(n for shape in shapes for n in shape) < 1:
        raise ValueError(text)
    return shapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: the CI smoke (no meaningful numbers)")
    parser.add_argument("--out", default="BENCHMARKS.md", help="report path (the plot and JSON go beside it)")
    parser.add_argument("--systems", default=",".join(ALL), help="comma-separated subset of: " + ", ".join(ALL))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset of: "
                        + ", ".join(SCENARIOS))
    parser.add_argument("--runs", type=int, default=None, help="runs per system and scenario")
    parser.add_argument("--tasks", type=int, default=None, help="burn-down task count")
    parser.add_argument("--history-finished", type=int, default=None)
    parser.add_argument("--history-delayed", type=int, default=None)
    parser.add_argument("--fleet-shapes", default=None, metavar="PROCESSESxCONCURRENCY,...",
                        help="the fleet scenario's shapes (default: 64x8,16x32)")
    parser.add_argument("--fleet-tasks", type=int, default=None, help="the fleet scenario's task count")
    parser.add_argument("--pgqueuer-batch-size", type=int, default=None,
                        help="PGQueuer dequeue batch (default: half the concurrency, the most its "
                        "max_concurrent_tasks allows)")
    parser.add_argument("--from-json", default=None, metavar="RESULTS.json",
                        help="only re-render the report from a previous run's raw results")
    args = parser.parse_args(argv)
    if args.from_json:
        report.write(Path(args.out), json.loads(Path(args.from_json).read_text()))
        print(f"wrote {args.out}", flush=True)
        return 0

    config = Config.quick() if args.quick else Config()
    for key in ("runs", "tasks", "history_finished", "history_delayed", "fleet_tasks"):
        if getattr(args, key) is not None:
            setattr(config, key, getattr(args, key))
    if args.fleet_shapes is not None:
        try:
            config.fleet_shapes = _fleet_shapes(args.fleet_shapes)
        except ValueError:
            parser.error(f"--fleet-shapes: expected shapes like 64x8,16x32, got {args.fleet_shapes!r}")
    if args.tasks is not None:
        config.history_tasks = 3 * args.tasks if not args.quick else args.tasks
    systems, skipped = [], {}
    for name in [s.strip() for s in args.systems.split(",") if s.strip()]:
        if name not in ALL:
            parser.error(f"unknown system {name!r}")
        system = ALL[name](args.pgqueuer_batch_size) if name == "pgqueuer" else ALL[name]()
        reason = system.unavailable()
        if reason:
            skipped[name] = reason
            print(f"skipping {name}: {reason}", flush=True)
        else:
            systems.append(system)
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for name in names:
        if name not in SCENARIOS:
            parser.error(f"unknown scenario {name!r}")

    def _terminate(signum, frame):  # a killed run still stops its workers and its Postgres
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _terminate)
    runner = Runner(config, systems, names, log=lambda m: print(m, flush=True))
    results = runner.run()
    results.update(config=asdict(config), quick=args.quick, skipped=skipped,
                   versions={s.name: s.version() for s in systems}, machine=report.machine(),
                   enqueue_paths={s.name: {"api": s.producer_api, "raw": s.raw_enqueue_sql,
                                           "raw_note": s.raw_enqueue_note} for s in systems},
                   python=platform.python_version(), command="python -m bench " + " ".join(
                       argv if argv is not None else sys.argv[1:]))
    out = Path(args.out)
    report.write(out, results)
    print(f"wrote {out}", flush=True)
    return 1 if results["errors"] and not systems else 0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")

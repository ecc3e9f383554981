"""BENCHMARKS.md from the runner's results: machine, versions, method, tables, targets, plot."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from collections import Counter
from pathlib import Path

from bench.scenarios import ENQUEUE_PATHS

# Capped at concurrency 100 already (hundreds to a few thousand tasks/s): the sweep leaves them out.
SWEEP_EXCLUDED = ("procrastinate", "pg-boss")
NOTES = Path(__file__).resolve().parent / "notes.md"
CONTROLLER_RESULTS = Path(__file__).resolve().parent / "controller.md"  # cluster-tier numbers, by hand


def machine() -> dict:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": mem, "kernel": platform.release()}


def _stats(values: list[float]) -> tuple[float, float, float]:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return (float("nan"),) * 3
    return statistics.median(values), min(values), max(values)


def _fmt(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _cell(values: list[float], digits: int = 0) -> str:
    med, lo, hi = _stats(values)
    if len(values) <= 1 or math.isnan(med):
        return _fmt(med, digits)
    return f"{_fmt(med, digits)} ({_fmt(lo, digits)}–{_fmt(hi, digits)})"


def summarize(results: dict) -> dict:
    """Medians the targets are judged on."""
    s: dict = {}
    burn = {name: _stats([r["tasks_per_s"] for r in runs])[0] for name, runs in results["burn"].items()}
    s["burn"] = burn
    s["best_python_peer"] = _best_python_peer(burn)
    s["drain"] = {int(c): _drain_medians(by_system) for c, by_system in results.get("sweep", {}).items()}
    if results["burn"]:
        s["drain"][results["config"]["concurrency"]] = _drain_medians(results["burn"])
    ceil = [r["tasks_per_s"] for r in results["ceiling"]]
    s["ceiling"] = max((_stats([r["tasks_per_s"] for r in results["ceiling"]
                                if (r["clients"], r["limit"]) == key])[0]
                        for key in {(r["clients"], r["limit"]) for r in results["ceiling"]}), default=float("nan")) \
        if ceil else float("nan")
    s["latency"] = results["latency"]
    lat = results["latency"].get("queueworker", [])
    s["idle_p50"] = _stats([r["idle_p50"] for r in lat])[0]
    s["idle_p99"] = _stats([r["idle_p99"] for r in lat])[0]
    s["load_p50"] = _stats([r["load_p50"] for r in lat])[0]
    s["load_p99"] = _stats([r["load_p99"] for r in lat])[0]
    floor = results.get("latency_floor", [])
    s["floor_p50"] = _stats([r["notify_p50"] for r in floor])[0]
    s["floor_p99"] = _stats([r["notify_p99"] for r in floor])[0]
    s["durable_floor_p50"] = _stats([r.get("durable_p50", float("nan")) for r in floor])[0]
    s["durable_floor_p99"] = _stats([r.get("durable_p99", float("nan")) for r in floor])[0]
    hist = results["history"]
    s["hist_empty"] = _stats([r["tasks_per_s"] for r in hist.get("empty", [])])[0]
    s["hist_big"] = _stats([r["tasks_per_s"] for r in hist.get("history", [])])[0]
    s["startup_claim_ms"] = _stats(results.get("startup", {}).get("queueworker", {}).get("claim_ms", []))[0]
    s["enqueue"] = {name: _stats([r["tasks_per_s"] for r in runs])[0]
                    for name, runs in results.get("enqueue", {}).items()}
    idle = results["idle"].get("queueworker", [])
    s["idle_stmts"] = _stats([r["stmts_per_s_per_worker"] for r in idle])[0]
    s["rss_idle"] = _stats([r["rss_idle_mb"] for r in idle])[0]
    s["rss_load"] = _stats([r["rss_load_mb"] for r in results["burn"].get("queueworker", [])])[0]
    return s


PYTHON_PEERS = ("pgqueuer", "procrastinate")


def _best_python_peer(rates: dict[str, float]) -> tuple[str, float] | None:
    peers = {k: v for k, v in rates.items() if k in PYTHON_PEERS and not math.isnan(v)}
    return max(peers.items(), key=lambda kv: kv[1]) if peers else None


def _drain_medians(by_system: dict[str, list[dict]]) -> dict[str, float]:
    """Whole-drain tasks/s (worker start to last task finished), median per system."""
    return {name: _stats([r.get("drain_tasks_per_s", float("nan")) for r in runs])[0]
            for name, runs in by_system.items()}


def _drain_targets(drain: dict[int, dict[str, float]]) -> list[tuple[str, str, str, str]]:
    """Whole-drain ≥1.5× the best Python peer and ahead of River, at every concurrency measured."""
    rows = []
    for concurrency in sorted(drain):
        rates = drain[concurrency]
        qw = rates.get("queueworker", float("nan"))
        peer = _best_python_peer(rates)
        river = rates.get("river", float("nan"))
        if math.isnan(qw) or peer is None:
            rows.append((f"Whole drain ≥1.5× best Python peer, concurrency {concurrency}", "–", "",
                         _verdict(None)))
        else:
            rows.append((f"Whole drain ≥1.5× best Python peer, concurrency {concurrency}",
                         f"{qw / peer[1]:.2f}× {peer[0]}", f"{_fmt(qw)} vs {_fmt(peer[1])} tasks/s",
                         _verdict(qw >= 1.5 * peer[1])))
        if not math.isnan(qw) and not math.isnan(river):
            rows.append((f"Whole drain ahead of River, concurrency {concurrency}", f"{qw / river:.2f}×",
                         f"{_fmt(qw)} vs {_fmt(river)} tasks/s", _verdict(qw > river)))
    return rows


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("**met**" if ok else "**missed**")


def targets(s: dict) -> list[tuple[str, str, str, str]]:
    rows = _drain_targets(s["drain"])
    qw = s["burn"].get("queueworker", float("nan"))
    peer = s["best_python_peer"]
    if peer and not math.isnan(qw):
        rows.append(("5–95% rate ≥1.5× best Python peer", f"{qw / peer[1]:.2f}× {peer[0]}",
                     f"{_fmt(qw)} vs {_fmt(peer[1])} tasks/s", _verdict(qw >= 1.5 * peer[1])))
    else:
        rows.append(("5–95% rate ≥1.5× best Python peer", "–", "no peer measured", _verdict(None)))
    if not math.isnan(s["ceiling"]) and not math.isnan(qw):
        rows.append(("≥75% of raw-SQL ceiling (5–95% rate)", f"{qw / s['ceiling']:.0%}",
                     f"{_fmt(qw)} / {_fmt(s['ceiling'])}", _verdict(qw >= 0.75 * s["ceiling"])))
    else:
        rows.append(("≥75% of raw-SQL ceiling (5–95% rate)", "–", "", _verdict(None)))
    for key, floor_key, label, factor in (
            ("idle_p50", "floor_p50", "Enqueue→start p50 (idle) ≤1.5× bare NOTIFY round trip p50", 1.5),
            ("idle_p99", "floor_p99", "Enqueue→start p99 (idle) ≤3× bare NOTIFY round trip p99", 3.0)):
        v, floor, durable = s[key], s[floor_key], s["durable_" + floor_key]
        known = not (math.isnan(v) or math.isnan(floor))
        detail = f"floor {_fmt(floor, 2)} ms"
        if not (math.isnan(v) or math.isnan(durable)):
            detail += f"; {v / durable:.2f}× the durable NOTIFY's {_fmt(durable, 2)} ms"
        rows.append((label, f"{_fmt(v, 2)} ms" + (f" ({v / floor:.2f}×)" if known else ""), detail,
                     _verdict(v <= factor * floor if known else None)))
    rows += _latency_targets(s["latency"])
    for key, label in (("load_p50", "Enqueue→start p50 ≤5 ms under load"),
                       ("load_p99", "Enqueue→start p99 ≤25 ms under load")):
        v = s[key]
        limit = 5.0 if key == "load_p50" else 25.0
        rows.append((label, f"{_fmt(v, 2)} ms", "", _verdict(None if math.isnan(v) else v <= limit)))
    e, b = s["hist_empty"], s["hist_big"]
    rows.append(("History scale ≥90% of empty-table throughput",
                 "–" if math.isnan(e) or math.isnan(b) else f"{b / e:.0%}", f"{_fmt(b)} vs {_fmt(e)} tasks/s",
                 _verdict(None if math.isnan(e) or math.isnan(b) else b >= 0.9 * e)))
    v = s["startup_claim_ms"]
    rows.append(("Start-up: process start → first claim ≤250 ms", f"{_fmt(v)} ms", "",
                 _verdict(None if math.isnan(v) else v <= 250)))
    enqueue = s["enqueue"]
    v = enqueue.get("queueworker", float("nan"))
    peer_rates = {name: rate for name, rate in enqueue.items() if not name.startswith("queueworker")}
    peers = ", ".join(f"{name} {_fmt(rate)}" for name, rate in peer_rates.items())
    rows.append(("Bulk enqueue ≥150,000 tasks/s, ahead of every peer's bulk API", f"{_fmt(v)} tasks/s", peers,
                 _verdict(None if math.isnan(v) else v >= 150_000 and all(v > rate for rate in peer_rates.values()))))
    sql = enqueue.get("queueworker-sql", float("nan"))
    rows.append(("SQL producer `enqueue_many(jsonb)` in the Python API's class: ≥half its rate", f"{_fmt(sql)} tasks/s",
                 f"Python API {_fmt(v)}", _verdict(None if math.isnan(sql) or math.isnan(v) else sql >= v / 2)))
    v = s["idle_stmts"]
    rows.append(("Idle worker ≤0.5 statements/s", f"{_fmt(v, 2)}", "",
                 _verdict(None if math.isnan(v) else v <= 0.5)))
    v = s["rss_idle"]
    rows.append(("Worker RSS ≤80 MB idle", f"{_fmt(v, 1)} MB", f"under load {_fmt(s['rss_load'], 1)} MB",
                 _verdict(None if math.isnan(v) else v <= 80)))
    rows.append(("Controller reaction ≤2 s p50", "–", "cluster tier: measured by bench/controller_reaction.py",
                 "see the Controller section"))
    rows.append(("Scale from zero, backlog → first task started, p50 ≤3 s", "–",
                 "real node: measured by bench/scale_from_zero.py", "see the Controller section"))
    return rows


def plot(path: Path, results: dict) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [n for n in results["burn"]] or [n for n in results["latency"]]
    sweep = _by_concurrency(results)
    fig, axes = plt.subplots(1, 3 if sweep else 2, figsize=(16 if sweep else 11, 4))
    ax = axes[0]
    meds, errs = [], [[], []]
    for n in names:
        med, lo, hi = _stats([r.get("drain_tasks_per_s", float("nan")) for r in results["burn"].get(n, [])])
        meds.append(0 if math.isnan(med) else med)
        errs[0].append(0 if math.isnan(med) else med - lo)
        errs[1].append(0 if math.isnan(med) else hi - med)
    ax.bar(names, meds, yerr=errs, capsize=4, color="#4c72b0")
    ceiling = summarize(results)["ceiling"]
    if not math.isnan(ceiling):
        ax.axhline(ceiling, color="#c44e52", linestyle="--", label=f"raw-SQL ceiling {ceiling:,.0f} (a steady rate)")
        ax.legend(fontsize=8)
    ax.set_title(f"Whole drain, {results['config']['tasks']:,} no-op tasks, "
                 f"{results['config']['processes']} × {results['config']['concurrency']}")
    ax.set_ylabel("tasks/s, start to last finished (median, min–max)")
    ax.tick_params(axis="x", labelrotation=15)
    ax = axes[1]
    lnames = list(results["latency"])
    width = 0.2
    series = (("idle_p50", "idle p50"), ("idle_p99", "idle p99"), ("load_p50", "load p50"), ("load_p99", "load p99"))
    for i, (key, label) in enumerate(series):
        vals = [_stats([r[key] for r in results["latency"][n]])[0] for n in lnames]
        ax.bar([j + (i - 1.5) * width for j in range(len(lnames))], [0 if math.isnan(v) else v for v in vals],
               width, label=label)
    ax.set_xticks(range(len(lnames)), lnames, rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("enqueue→start ms (median of runs, log)")
    ax.set_title(f"Latency: idle, and at {results['config']['load_rate']:,} tasks/s")
    ax.legend(fontsize=8)
    if sweep:
        ax = axes[2]
        for n in dict.fromkeys(n for by_system in sweep.values() for n in by_system):
            points = [(c, _stats([r.get("drain_tasks_per_s", float("nan")) for r in by_system[n]]))
                      for c, by_system in sweep.items() if n in by_system]
            xs = [c for c, _ in points]
            ax.errorbar(xs, [m for _, (m, _, _) in points],
                        yerr=[[m - lo for _, (m, lo, _) in points], [hi - m for _, (m, _, hi) in points]],
                        marker="o", capsize=3, label=n)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(list(sweep), [str(c) for c in sweep])
        ax.set_xlabel("concurrency per worker process")
        ax.set_ylabel("tasks/s, start to last finished (median)")
        ax.set_title("Whole drain against concurrency")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _by_concurrency(results: dict) -> dict[int, dict[str, list[dict]]]:
    """Burn-down runs by concurrency per process: the sweep's and the burn-down's own."""
    table = {int(c): by_system for c, by_system in results.get("sweep", {}).items()}
    if results["burn"] and table:
        table[results["config"]["concurrency"]] = {n: r for n, r in results["burn"].items()
                                                   if any(n in t for t in table.values())}
    return dict(sorted(table.items()))


# The latency scenario's enqueue paths (bench.scenarios.ENQUEUE_PATHS) and the key prefix of each.
LATENCY_PATHS = (("own API", ENQUEUE_PATHS["api"], "API"), ("raw INSERT + NOTIFY", ENQUEUE_PATHS["raw"], "raw"))
LATENCY_MEASURES = (("idle p50", "idle_p50"), ("idle p99", "idle_p99"), ("load p50", "load_p50"),
                    ("load p99", "load_p99"))


def _latency_paths_section(results: dict) -> list[str]:
    """Enqueue-to-start latency through each system's own API and through a raw INSERT, side by side."""
    by_system = {n: runs for n, runs in results["latency"].items() if any("raw_idle_p50" in r for r in runs)}
    if not by_system:
        return []
    paths = results.get("enqueue_paths", {})
    lines = ["", "Enqueue→start latency by enqueue path (ms): through the system's own API (API) and by a raw "
             "INSERT plus its NOTIFY (raw):", "",
             "| system | own API | " + " | ".join(f"{short} {label}" for _, _, short in LATENCY_PATHS
                                                  for label, _ in LATENCY_MEASURES) + " |",
             "|---|---|" + "---:|" * (len(LATENCY_PATHS) * len(LATENCY_MEASURES))]
    for n, runs in by_system.items():
        cells = [_cell([r.get(prefix + key, float("nan")) for r in runs], 2)
                 for _, prefix, _ in LATENCY_PATHS for _, key in LATENCY_MEASURES]
        lines.append(f"| {n} | {paths.get(n, {}).get('api', '')} | " + " | ".join(cells) + " |")
    notes = [f"{n}: {p['raw_note']}" for n, p in paths.items() if p.get("raw_note") and n in by_system]
    if notes:
        lines += ["", "Where a raw path writes less than the system's own client: " + "; ".join(notes) + "."]
    return lines


def _latency_targets(latency: dict[str, list[dict]]) -> list[tuple[str, str, str, str]]:
    """Enqueue-to-start at or below the best peer's, idle (p50, p99) and under load (p50), per path."""
    rows = []
    for path, prefix, _ in LATENCY_PATHS:
        for label, key in LATENCY_MEASURES[:3]:
            medians = {n: _stats([r.get(prefix + key, float("nan")) for r in runs])[0] for n, runs in latency.items()}
            qw = medians.pop("queueworker", float("nan"))
            peers = {n: v for n, v in medians.items() if not math.isnan(v)}
            title = f"Enqueue→start {label} ({path}) at or below the best peer's"
            if math.isnan(qw) or not peers:
                rows.append((title, "–", "", _verdict(None)))
                continue
            best = min(peers.items(), key=lambda kv: kv[1])
            rows.append((title, f"{_fmt(qw, 2)} ms", f"{best[0]} {_fmt(best[1], 2)} ms", _verdict(qw <= best[1])))
    return rows


def _sweep_section(results: dict) -> list[str]:
    table = _by_concurrency(results)
    if not table:
        return []
    names = list(dict.fromkeys(n for by_system in table.values() for n in by_system))
    lines = ["", f"Whole drain against concurrency ({results['config']['tasks']:,} no-op tasks, "
             f"{results['config']['processes']} processes, concurrency per process; tasks/s from starting the "
             "workers to the last task finished, and the 5–95% rate below it):", "",
             "| concurrency | " + " | ".join(names) + " | queueworker ÷ best Python peer |",
             "|---:|" + "---:|" * (len(names) + 1)]
    drain = {c: _drain_medians(by_system) for c, by_system in table.items()}
    for concurrency, by_system in table.items():
        peer = _best_python_peer(drain[concurrency])
        qw = drain[concurrency].get("queueworker", float("nan"))
        ratio = "–" if peer is None or math.isnan(qw) else f"{qw / peer[1]:.2f}×"
        cells = []
        for n in names:
            runs = by_system.get(n, [])
            cells.append(f"{_cell([r.get('drain_tasks_per_s', float('nan')) for r in runs])}<br>"
                         f"{_cell([r['tasks_per_s'] for r in runs])}")
        lines.append(f"| {concurrency} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def _processes_section(results: dict) -> list[str]:
    supervised = results.get("processes", {})
    if not supervised:
        return []
    c = results["config"]
    lines = ["", f"One pod's command, `queueworker worker --processes N --concurrency {c['concurrency']}` (one "
             f"supervisor, N workers), on the burn-down of {c['tasks']:,} tasks; this machine has "
             f"{results['machine']['cores']} cores, shared with Postgres:", "",
             "| N | whole drain s | whole drain tasks/s | 5–95% tasks/s | worker CPU µs/task | RSS MB (all processes) |",
             "|---:|---:|---:|---:|---:|---:|"]
    for name, runs in sorted(supervised.items()):
        lines.append(f"| {name.rsplit('-', 1)[1]} | {_cell([r['drain_seconds'] for r in runs], 2)} "
                     f"| {_cell([r['drain_tasks_per_s'] for r in runs])} | {_cell([r['tasks_per_s'] for r in runs])} "
                     f"| {_cell([r['worker_cpu_us_per_task'] for r in runs])} "
                     f"| {_cell([r['rss_load_mb'] for r in runs], 1)} |")
    return lines


# pgmq's published write figure, for comparison (not measured here: other hardware, many writers).
PGMQ_PUBLISHED = ("PGMQ's authors report writing over 150,000 messages/s with 20 concurrent writers each sending "
                  "batches of 100, on one Postgres instance with 16 vCPU and 32 GB "
                  "(Tembo, 2023-12-06, https://tembo.io/blog/mq-stack-benchmarking); a different machine and "
                  "20 writers against one here, so a reference point, not a comparison on equal terms.")


def _enqueue_lines(results: dict) -> list[str]:
    """The bulk enqueue table (bench/enqueue.py), or nothing when the scenario did not run."""
    enqueue = results.get("enqueue") or {}
    if not enqueue:
        return []
    batches = sorted({r["batch"] for runs in enqueue.values() for r in runs})
    tasks = sorted({r["tasks"] for runs in enqueue.values() for r in runs})
    lines = ["", f"Bulk enqueue (tasks/s, median (min–max)): {', '.join(f'{t:,}' for t in tasks)} no-op tasks "
             f"through each system's own bulk API in calls of {', '.join(f'{b:,}' for b in batches)}, each call "
             "committed, no worker running (bench/enqueue.py):", "", "| system | API | tasks/s |", "|---|---|---:|"]
    apis = {"queueworker": "`enqueue_many`", "queueworker-sql": "SQL `queueworker.enqueue_many(jsonb)`",
            "pgqueuer": "`Queries.enqueue` (lists)",
            "procrastinate": "`Task.batch_defer_async`"}
    for name, runs in enqueue.items():
        lines.append(f"| {name} | {apis.get(name, '–')} | {_cell([r['tasks_per_s'] for r in runs])} |")
    return lines + ["", PGMQ_PUBLISHED]


def write(out: Path, results: dict) -> None:
    out = out.resolve()
    art_dir = out.parent / "bench" / "report" if (out.parent / "bench").is_dir() else out.parent
    stem = "benchmarks-quick" if results.get("quick") else "benchmarks"
    art_dir.mkdir(parents=True, exist_ok=True)
    png, raw = art_dir / f"{stem}.png", art_dir / f"{stem}.json"
    raw.write_text(json.dumps(results, indent=1, default=str))
    has_plot = plot(png, results)
    c = results["config"]
    s = summarize(results)
    m = results["machine"]
    lines = ["# Benchmarks", ""]
    if results.get("quick"):
        lines += ["> **Quick mode** (CI smoke): tiny sizes, the numbers mean nothing.", ""]
    lines += [
        f"Generated by `{results['command']}` in {results.get('seconds', 0) / 60:.1f} min. "
        f"Raw results: `{os.path.relpath(raw, out.parent)}`.", "",
        "## Machine and versions", "",
        f"- {m['cpu']}, {m['cores']} cores, {m['memory']} RAM, Linux {m['kernel']}; Python {results['python']}",
        f"- PostgreSQL {results['postgres']} started by the runner, durable "
        f"({', '.join(f'{k}={v}' for k, v in sorted(results['pg_settings'].items()))}), "
        "one server for every system, a fresh database per run",
        f"- Load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in results['load_before'])}, "
        f"after: {' / '.join(f'{x:.2f}' for x in results['load_after'])}. The machine is shared with other "
        "engineers' test runs: runs alternate between systems so drift hits all of them alike.",
    ]
    lines += [f"- {name}: {ver}" for name, ver in results["versions"].items()]
    lines += [f"- {name}: skipped, {why}" for name, why in results.get("skipped", {}).items()]
    lines += ["", "## Method", "",
              f"- Every system: {c['processes']} worker processes, concurrency {c['concurrency']} each, its own "
              "worker entry point, tasks `noop` (returns at once) and `record` (latency probe). Harnesses: `bench/`.",
              f"- **Burn-down**: {c['tasks']:,} no-op tasks pre-enqueued (not timed), then the workers start. A "
              "sampler reads `clock_timestamp()` and the count of unfinished rows every 0.5 s (counting costs "
              "Postgres ~30 ms at 100k rows), every 20 ms once 5% are left. The headline is the **whole drain**: "
              "from starting the worker processes (interpreter start-up included) to the first sample with "
              "nothing left, as a user waits for it. Beside it the steady rate between 5% and 95% drained, "
              f"or over {c['burn_cap_seconds']:.0f} s after "
              f"5% when a system is slower than that (marked *capped*, no whole drain). {c['runs']} runs per "
              "system, order rotated "
              "every round; a CHECKPOINT after the preload so every run starts alike. Peak worker RSS is sampled "
              "during the run; CPU per task is the workers' and the Postgres backends' user+system CPU over the "
              "whole drain (approximate for Postgres: processes that exited during the run are not counted).",
              f"- **Concurrency sweep**: the same burn-down at concurrency {', '.join(map(str, c.get('sweep_concurrency', ())))} "
              f"per process (and {c['concurrency']} from above), for every system but {', '.join(SWEEP_EXCLUDED)} "
              "(capped at the default already). PGQueuer's dequeue batch is half its concurrency, the most its "
              "`max_concurrent_tasks` allows.",
              f"- **Latency**: enqueue wall-clock time goes in the payload; the handler writes `now − t` at start. "
              f"Idle: {c['idle_samples']} single tasks 50 ms apart to idle workers (the LISTEN/NOTIFY path). "
              f"Under load: {c['load_rate']:,} tasks/s in 10 ms ticks for {c['load_seconds']:.0f} s. "
              "Each system is enqueued two ways, one after the other with the same workers: through its own "
              "client API (the Node and Go clients run in a producer process of their own, driven over a pipe, "
              "and stamp each task themselves just before the call, so the pipe is not counted), and by a raw "
              "INSERT plus the NOTIFY that its own insert sends, in one autocommit statement "
              "(`raw_enqueue_sql` in bench/systems.py). The main table shows the own API. "
              "Before and after the scenario, the machine's floor for the idle path: a bare `SELECT pg_notify` "
              "(autocommit) every 50 ms from one connection to another idle in LISTEN, no queue involved.",
              f"- **Idle cost**: workers idle {c['idle_settle']:.0f} s to settle, then `pg_stat_statements` calls "
              f"(and `pg_stat_database` transactions) in their database over {c['idle_window']:.0f} s, per worker; "
              "RSS at the end.",
              "- **Raw-SQL ceiling**: pgbench (`-M prepared`) looping exactly `lease.CLAIM` (its RETURNING rows "
              "aggregated into arrays with `\\gset`) and `lease.COMPLETE_SUCCEEDED`, audit triggers on, the claim "
              "with `synchronous_commit` off and a generic plan, the completion with it on and a plan for its "
              "parameters (as a worker's connections run them), "
              "over the same task count; tasks/s from the first `started_at` to the last `finished_at`.",
              f"- **History scale** (queueworker): {c['history_finished']:,} succeeded + {c['history_delayed']:,} "
              "delayed (pending, due in a day, same queue and priority) rows made by one INSERT … SELECT "
              "generate_series each (triggers off for those two statements), VACUUM ANALYZE, then the burn-down of "
              f"{c['history_tasks']:,} tasks, with `autovacuum_naptime` at 5 s for this scenario so that "
              "autovacuum visits the table during every run, as it does all day in a long-running queue; compared with an "
              f"empty table, alternating, {c['history_runs']} runs each. Also the cost of one CLAIM when nothing is "
              "due (what each idle poll pays), and the share of sampler ticks with a VACUUM running in the database.",
              f"- **Fan-in** (queueworker): a partitioned run of {c.get('fanin_partitions', 0):,} no-op partitions "
              "with a no-op consolidation (`start_run`), against the same number of plain no-op tasks "
              f"(`enqueue_many`), fresh database each, alternating, {c.get('fanin_runs', 0)} runs each; drain "
              "from the first start to the last partition's end (database clock), the lag from the last "
              "partition's end to the consolidation's start, and the wall time from starting the workers to the "
              "run's success.",
              f"- **Dependency graphs** (queueworker, bench/graphs.py): one dependent of "
              f"{c.get('graph_prerequisites', 0):,} prerequisites enqueued in one transaction (enqueue and commit), "
              "its prerequisites then completed 100 at a time by `COMPLETE_SUCCEEDED`; "
              f"{c.get('graph_dependents', 0):,} dependents of one prerequisite enqueued in one transaction, then "
              "the completion of that prerequisite, which releases them all; a chain of "
              f"{c.get('graph_chain', 0):,} stages (`enqueue_chain`) run to its end by `CLAIM` and "
              "`COMPLETE_SUCCEEDED`, one stage at a time; fresh "
              f"database each, {c.get('graph_runs', 0)} runs each.",
              f"- **Flow control** (queueworker): the burn-down above on a queue with a rate limit of "
              f"1,000,000/s and as big a burst (never binding: every claim locks the queue's row with `LOCK_QUEUE`, "
              f"then runs `CLAIM_LIMITED`, in one transaction), against the same queue without, fresh database each, alternating, "
              f"{c.get('flow_runs', 0)} runs each.",
              ""]

    lines += ["## Results", "", "Median of runs, (min–max) where there is more than one run.", ""]
    if has_plot:
        lines += [f"![benchmarks]({os.path.relpath(png, out.parent)})", ""]
    lines += ["| system | whole drain s | whole drain tasks/s | 5–95% tasks/s | worker CPU µs/task | Postgres CPU µs/task | idle p50 ms | idle p99 ms "
              "| load p50 ms | load p99 ms | idle stmts/s/worker | RSS idle MB | RSS load MB |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    names = list(dict.fromkeys([*results["burn"], *results["latency"], *results["idle"]]))
    for n in names:
        burn = results["burn"].get(n, [])
        lat = results["latency"].get(n, [])
        idle = results["idle"].get(n, [])
        capped = " *capped*" if any(r.get("capped") for r in burn) else ""
        lines.append(
            f"| {n} | {_cell([r.get('drain_seconds', float('nan')) for r in burn], 2)} "
            f"| {_cell([r.get('drain_tasks_per_s', float('nan')) for r in burn])} "
            f"| {_cell([r['tasks_per_s'] for r in burn])}{capped} "
            f"| {_cell([r.get('worker_cpu_us_per_task', float('nan')) for r in burn])} "
            f"| {_cell([r.get('pg_cpu_us_per_task', float('nan')) for r in burn])} "
            f"| {_cell([r['idle_p50'] for r in lat], 2)} "
            f"| {_cell([r['idle_p99'] for r in lat], 2)} | {_cell([r['load_p50'] for r in lat], 1)} "
            f"| {_cell([r['load_p99'] for r in lat], 1)} | {_cell([r['stmts_per_s_per_worker'] for r in idle], 2)} "
            f"| {_cell([r['rss_idle_mb'] for r in idle], 1)} | {_cell([r['rss_load_mb'] for r in burn], 1)} |")
    lines += _latency_paths_section(results)
    lines += _sweep_section(results)
    lines += _processes_section(results)
    floor = results.get("latency_floor", [])
    if floor:
        lines += ["", "Machine floor for the idle path (bare NOTIFY round trip, before and after the latency "
                  f"scenario): p50 {_cell([r['notify_p50'] for r in floor], 2)} ms, "
                  f"p99 {_cell([r['notify_p99'] for r in floor], 2)} ms; the sender's own `SELECT pg_notify` "
                  f"call alone takes {_cell([r['call_p50'] for r in floor], 2)} ms (p50). The same NOTIFY from a "
                  "statement that also inserts a row (its commit waits for the disk, as a durable enqueue's "
                  f"does): p50 {_cell([r.get('durable_p50', float('nan')) for r in floor], 2)} ms, "
                  f"p99 {_cell([r.get('durable_p99', float('nan')) for r in floor], 2)} ms (the call alone "
                  f"{_cell([r.get('durable_call_p50', float('nan')) for r in floor], 2)} ms)."]
    if results["ceiling"]:
        lines += ["", "Raw-SQL ceiling (pgbench, our CLAIM + COMPLETE_SUCCEEDED):", "",
                  "| clients × claim limit | tasks/s |", "|---|---:|"]
        for key in sorted({(r["clients"], r["limit"]) for r in results["ceiling"]}):
            vals = [r["tasks_per_s"] for r in results["ceiling"] if (r["clients"], r["limit"]) == key]
            lines.append(f"| {key[0]} × {key[1]} | {_cell(vals)} |")
    hist = results["history"]
    if hist.get("empty") or hist.get("history"):
        lines += ["", f"History scale (queueworker; history built in {hist.get('build_seconds', 0):.0f} s):", "",
                  "| table | claim throughput tasks/s | worker CPU µs/task | Postgres CPU µs/task "
                  "| vacuum running (share of run) | idle CLAIM ms | idle CLAIM buffers |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for label in ("empty", "history"):
            runs = hist.get(label, [])
            lines.append(f"| {label} | {_cell([r['tasks_per_s'] for r in runs])} "
                         f"| {_cell([r.get('worker_cpu_us_per_task', float('nan')) for r in runs])} "
                         f"| {_cell([r.get('pg_cpu_us_per_task', float('nan')) for r in runs])} "
                         f"| {_cell([100 * r.get('vacuum_active', float('nan')) for r in runs])}% "
                         f"| {_cell([r['idle_claim_ms'] for r in runs], 2)} "
                         f"| {_cell([r['idle_claim_buffers'] for r in runs])} |")
    fanin = results.get("fanin", [])
    if fanin:
        lines += ["", f"Partitioned run fan-in (queueworker; {c.get('fanin_partitions', 0):,} no-op partitions and a "
                  "no-op consolidation, against as many plain no-op tasks):", "",
                  "| tasks | enqueue tasks/s | drain tasks/s | last partition → consolidation starts, ms "
                  "| worker start → run done, s |", "|---|---:|---:|---:|---:|"]
        for kind in ("plain", "run"):
            rows = [r for r in fanin if r["kind"] == kind]
            lag = _cell([r["fan_in_lag_ms"] for r in rows], 1) if kind == "run" else "–"
            lines.append(f"| {kind} | {_cell([r['enqueue_per_s'] for r in rows])} "
                         f"| {_cell([r['tasks_per_s'] for r in rows])} | {lag} "
                         f"| {_cell([r['wall_seconds'] for r in rows], 2)} |")
    flow = results.get("flow", [])
    if flow:
        lines += ["", "Flow control (queueworker; the same burn-down on a queue whose rate limit never binds, so every "
                  "claim takes the limited path, against the queue without):", "",
                  "| queue | burn-down tasks/s | worker CPU µs/task | Postgres CPU µs/task |", "|---|---:|---:|---:|"]
        for limited in (False, True):
            rows = [r for r in flow if r["limited"] == limited]
            lines.append(f"| {'rate-limited' if limited else 'plain'} | {_cell([r['tasks_per_s'] for r in rows])} "
                         f"| {_cell([r.get('worker_cpu_us_per_task', float('nan')) for r in rows])} "
                         f"| {_cell([r.get('pg_cpu_us_per_task', float('nan')) for r in rows])} |")
    lines += _graph_lines(results)
    lines += _fleet_lines(results)
    lines += _enqueue_lines(results)
    started = results.get("startup", {})
    if started:
        lines += ["", "Start-up: process start → first claim, ms (`bench/startup.py`: one no-op task waiting, the "
                  "worker spawned; claim and finish times from the database's clock; median (min–max) of "
                  f"{c.get('startup_runs', 0)} runs after one not counted):", "",
                  "| system | → first claim ms | → task finished ms |", "|---|---:|---:|"]
        for n, r in started.items():
            lines.append(f"| {n} | {_cell(r['claim_ms'])} | {_cell(r['finished_ms'])} |")
    idle_rows = [(n, r) for n, runs in results["idle"].items() for r in runs]
    if idle_rows:
        lines += ["", "Idle statements by system (top 5 in the window, calls):", ""]
        for n, r in idle_rows:
            top = "; ".join(f"{c}× `{q.strip()[:60]}`" for c, q in r["top_statements"]) or "none"
            lines.append(f"- {n}: {r['stmts_per_s_per_worker']:.2f} statements/s and "
                         f"{r['xacts_per_s_per_worker']:.2f} transactions/s per worker — {top}")
    lines += ["", "## Targets (queueworker)", "", "| target | measured | detail | verdict |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c_} | {d} |" for a, b, c_, d in targets(s)]
    if results["errors"]:
        lines += ["", "## Errors in this run", ""]
        lines += [f"- {e['scenario']} / {e['system']}: `{e['error'][:300]}`" for e in results["errors"]]
    for section in (CONTROLLER_RESULTS, NOTES):
        if section.exists():
            lines += ["", section.read_text().strip()]
    out.write_text("\n".join(lines) + "\n")


def _graph_lines(results: dict) -> list[str]:
    """The dependency graphs' costs (bench/graphs.py), medians of the runs."""
    rows = results.get("graphs", [])
    if not rows:
        return []
    def cell(kind: str, key: str, digits: int = 2) -> str:
        return _cell([r[key] for r in rows if r["kind"] == kind], digits)
    c = results.get("config", {})
    return ["", "Dependency graphs (queueworker; settled by counts, no global lock):", "",
            "| graph | enqueue and commit, s | settling, s |", "|---|---:|---:|",
            f"| one dependent of {c.get('graph_prerequisites', 0):,} prerequisites | {cell('fan-in', 'enqueue_commit_s')} "
            f"| slowest completion of 100 of them: {cell('fan-in', 'slowest_completion_s', 3)} |",
            f"| {c.get('graph_dependents', 0):,} dependents of one prerequisite | {cell('fan-out', 'enqueue_commit_s')} "
            f"| the completion that releases them all: {cell('fan-out', 'release_s')} |",
            f"| a chain of {c.get('graph_chain', 0):,} stages, stage by stage | – "
            f"| a stage: {cell('chain', 'per_stage_ms')} ms (a plain task the same way: "
            f"{cell('chain', 'plain_per_task_ms')} ms); to the last stage: {cell('chain', 'wall_s', 0)} s |"]


def _fleet_lines(results: dict) -> list[str]:
    """The fleet benchmark (bench/scenarios.py `fleet`): per shape, a column per system."""
    fleet = results.get("fleet", {})
    if not fleet:
        return []
    c = results.get("config", {})
    lines = ["", f"Fleets of worker processes against one Postgres (max_connections raised): the whole drain of "
             f"{c.get('fleet_tasks', 0):,} no-op tasks from starting the processes (start-up counted); the "
             "database's sessions sampled every 50 ms during it (lock waits: sessions waiting for a lock, mean "
             "and most at once, and the share of samples with any); statements per second over it (all, and "
             "the heartbeats and rescues of the systems whose statements are known); then enqueue→start "
             "with the fleet started anew (idle, and under the latency scenario's load)."]
    rows = (("whole drain tasks/s", "drain_tasks_per_s", 0), ("5–95% tasks/s", "tasks_per_s", 0),
            ("lock waits mean", "lock_waits_mean", 2), ("lock waits most", "lock_waits_max", 0),
            ("samples with a lock wait", "lock_wait_share", 2), ("connections, most", "connections_max", 0),
            ("statements/s", "statements_per_s", 0), ("heartbeats/s", "heartbeats_per_s", 1),
            ("rescues/s", "rescues_per_s", 1), ("idle p50 ms", "idle_p50", 2), ("idle p99 ms", "idle_p99", 2),
            ("load p50 ms", "load_p50", 2), ("load p99 ms", "load_p99", 2))
    for shape, by_system in fleet.items():
        processes, concurrency = shape.split("x")
        names = list(by_system)
        lines += ["", f"{processes} processes × concurrency {concurrency}:", "",
                  "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for label, key, digits in rows:
            lines.append(f"| {label} | " + " | ".join(
                _cell([r.get(key, float("nan")) for r in by_system[n]], digits) for n in names) + " |")
        lines.append("| lock waits by type | " + " | ".join(
            _lock_types([r.get("lock_waits_by_type", {}) for r in by_system[n]]) for n in names) + " |")
    return lines


def _lock_types(runs: list[dict[str, int]]) -> str:
    """The types of lock the sessions waited for (pg_stat_activity's wait_event), with each one's
    share of the waits seen in every sample of every run; the three most common."""
    seen = sum(map(Counter, runs), Counter())
    total = sum(seen.values())
    if not total:
        return "none"
    return ", ".join(f"{kind} {count / total:.0%}" for kind, count in seen.most_common(3))

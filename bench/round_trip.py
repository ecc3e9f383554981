"""The machine's floor for one statement's round trip from Python, on a connection idle for a while
and on a busy one.

    .venv/bin/python -m bench.round_trip [--samples 200]

`SELECT 1` on one autocommit connection: 50 ms apart (idle: the client and the server's backend
both sleep in between, as a worker's claim connection does before the notification that wakes
it) and back to back (busy); with psycopg's blocking connection, its asyncio one (a worker's),
and the asyncio one sending two statements in one pipeline (a worker's claim: its transaction
settings, then the claim). p50 and p90 of each, in milliseconds. What the idle enqueue→start
latency pays for each round trip a claim makes, before any execution. The same loop from Go (pgx,
as River's workers) when bench/peers/roundtrip/round-trip is built (see its main.go).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg

from queueworker.dev.localpg import LocalPostgres

IDLE_SECONDS = 0.05
GO_PROGRAM = Path(__file__).resolve().parent / "peers" / "roundtrip" / "round-trip"


async def _timed(samples: int, pause: float, call: Callable[[], Awaitable[object]]) -> list[float]:
    times = []
    for _ in range(samples):
        if pause:
            await asyncio.sleep(pause)
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return times


def _blocking(dsn: str, samples: int, pause: float) -> list[float]:
    times = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(samples):
            if pause:
                time.sleep(pause)
            started = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            times.append(time.perf_counter() - started)
    return times


async def _asynchronous(dsn: str, samples: int) -> dict[str, list[float]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        async def one() -> None:
            await (await conn.execute("SELECT 1")).fetchone()

        async def pipelined() -> None:
            async with conn.pipeline():
                await conn.execute("SELECT set_config('plan_cache_mode', 'force_generic_plan', true)")
                cursor = await conn.execute("SELECT 1")
            await cursor.fetchall()

        return {"asyncio, idle": await _timed(samples, IDLE_SECONDS, one),
                "asyncio, busy": await _timed(samples, 0, one),
                "asyncio, pipeline of two, idle": await _timed(samples, IDLE_SECONDS, pipelined)}


def _go(dsn: str, samples: int) -> list[str]:
    """The Go program's lines, or why there are none."""
    if not GO_PROGRAM.exists():
        return ["go pgx: not built (cd bench/peers/roundtrip && go build -o round-trip .)"]
    out = subprocess.run([str(GO_PROGRAM), dsn, str(samples)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"round-trip failed: {out.stderr.strip()}")
    lines = []
    for line in out.stdout.splitlines():
        name, p50, p90 = line.rsplit(" ", 2)
        lines.append(f"{name:<32} p50 {float(p50):.3f} ms  p90 {float(p90):.3f} ms")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.round_trip", description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    server = LocalPostgres(durable=True)
    dsn = server.start()
    try:
        results = {"blocking, idle": _blocking(dsn, args.samples, IDLE_SECONDS),
                   "blocking, busy": _blocking(dsn, args.samples, 0),
                   **asyncio.run(_asynchronous(dsn, args.samples))}
        go_lines = _go(dsn, args.samples)
    finally:
        server.stop()
    for name, times in results.items():
        times.sort()
        print(f"{name:<32} p50 {statistics.median(times) * 1000:.3f} ms  "
              f"p90 {times[int(len(times) * 0.9)] * 1000:.3f} ms")
    print("\n".join(go_lines))


if __name__ == "__main__":
    main()

"""Procrastinate app and worker process for the benchmark: tasks `noop` and `record`."""

from __future__ import annotations

import argparse
import asyncio

import procrastinate

from bench.peers.record import record as _record


def make_app(dsn: str, pool_size: int = 10) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_size))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    @app.task(name="record")
    async def record(t: float) -> None:
        _record(t)

    return app


async def main(dsn: str, concurrency: int) -> None:
    app = make_app(dsn)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, listen_notify=True, install_signal_handlers=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.dsn, args.concurrency))

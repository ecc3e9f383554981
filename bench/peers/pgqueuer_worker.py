"""PGQueuer worker process for the benchmark: asyncpg driver (its fastest), `noop` and `record`."""

from __future__ import annotations

import argparse
import asyncio
import signal
from datetime import timedelta

import asyncpg
from pgqueuer import PgQueuer

from bench.peers.record import record as _record


async def main(dsn: str, concurrency: int, batch_size: int) -> None:
    conn = await asyncpg.connect(dsn)
    pgq = PgQueuer.from_asyncpg_connection(conn)

    @pgq.entrypoint("noop")
    async def noop(job) -> None:
        return None

    @pgq.entrypoint("record")
    async def record(job) -> None:
        _record(float(job.payload.decode()))

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, pgq.shutdown.set)
    await pgq.run(batch_size=batch_size, max_concurrent_tasks=concurrency,
                  dequeue_timeout=timedelta(seconds=30))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=10)
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(args.dsn, args.concurrency, args.batch_size))

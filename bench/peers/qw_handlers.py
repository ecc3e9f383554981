"""queueworker handler module for the benchmark: `bench.record` (latency probe)."""

from queueworker import task

from bench.peers.record import record as _record


@task(name="bench.record")
async def record(payload):
    _record(payload["t"])

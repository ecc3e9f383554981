"""The latency probe every system's `record` task calls: enqueue-to-start in ms, one line per task.

The producer puts its wall-clock time (time.time()) into the payload just before the enqueue
call; the handler appends `now - t` to $BENCH_LAT_FILE.<pid>. Same clock, same machine.
"""

from __future__ import annotations

import os
import time

_out = None


def record(t0: float) -> None:
    global _out
    now = time.time()
    if _out is None:
        path = os.environ.get("BENCH_LAT_FILE")
        if not path:
            return
        _out = open(f"{path}.{os.getpid()}", "a", buffering=1)
    _out.write(f"{(now - float(t0)) * 1000:.3f}\n")

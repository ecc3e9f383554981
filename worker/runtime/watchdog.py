"""A watchdog thread that notices when the event loop stops answering.

An async handler that does blocking work (time.sleep, a synchronous HTTP call, a long CPU loop)
freezes every other attempt, the heartbeats and the claim loop of its worker. A coroutine cannot
see that while it happens; a thread can: it pings the loop and, when no answer comes within the
threshold, logs what the loop's thread is running at that moment and counts it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

from .. import metrics

log = logging.getLogger("queueworker.watchdog")

PING_INTERVAL_SECONDS = 0.5
BLOCKED_THRESHOLD_SECONDS = 1.0


class LoopWatchdog:
    def __init__(self, loop: asyncio.AbstractEventLoop, threshold: float = BLOCKED_THRESHOLD_SECONDS,
                 interval: float = PING_INTERVAL_SECONDS):
        self._loop = loop
        self._threshold = threshold
        self._interval = interval
        self._loop_thread = threading.get_ident()  # started from the loop's own thread
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                if not self._ping():
                    return
            except Exception:  # noqa: BLE001 - the watchdog must outlive its own errors
                log.exception("the event loop watchdog failed; it carries on")

    def _ping(self) -> bool:
        """One ping; False once the loop is closed."""
        pinged = time.monotonic()
        answered = threading.Event()
        try:
            self._loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # the loop is closed
            return False
        if not answered.wait(self._threshold):
            self._report_blocked(pinged, answered)
        metrics.EVENT_LOOP_LAG.set(time.monotonic() - pinged)
        return True

    def _report_blocked(self, pinged: float, answered: threading.Event) -> None:
        metrics.EVENT_LOOP_BLOCKED.inc()
        log.warning("the event loop has not answered for %.1f s: an async handler may be doing blocking work "
                    "(use a sync handler or asyncio.to_thread); it is running:\n%s",
                    time.monotonic() - pinged, self._loop_stack())
        while not answered.wait(self._interval):
            if self._stopped.is_set():
                return
        log.warning("the event loop was blocked for %.1f s", time.monotonic() - pinged,
                    extra={"blocked_seconds": round(time.monotonic() - pinged, 3)})

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return "(unknown)"
        return "".join(traceback.format_stack(frame, limit=8)).rstrip()

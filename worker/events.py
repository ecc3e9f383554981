"""Waiting on an asyncio.Event with a timeout.

asyncio.wait_for() on Python 3.11 can swallow a cancellation that races with the event being
set, which left duties running after shutdown cancelled them; asyncio.timeout() does not.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """True if the event was set within `timeout` seconds (None: wait forever)."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
        return True
    except TimeoutError:
        return False

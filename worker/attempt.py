"""One leased attempt held by a worker, from claim until its outcome is flushed or released."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .handlers import TaskContext


@dataclass(eq=False)
class Attempt:
    id: int
    token: int
    queue: str
    task: str
    payload: Any
    attempt: int
    max_attempts: int
    deadline: float  # event-loop time of the hard deadline
    ctx: TaskContext
    runner: asyncio.Task | None = None
    reporting: bool = False   # handler finished; outcome waits in the completer
    abandoned: bool = False   # lease lost or released: any outcome is discarded
    started: float = field(default=0.0)

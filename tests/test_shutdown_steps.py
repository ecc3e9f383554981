"""The steps of a worker's shutdown that stand on their own (queueworker.runtime.shutdown)."""

from __future__ import annotations

import asyncio

from queueworker.runtime.shutdown import sever


class Statement:
    """A Severable whose statement notices the severing after `polls` looks (never, with None)."""

    def __init__(self, polls: int | None):
        self.polls, self.severed, self.looks = polls, False, 0

    def sever(self) -> None:
        self.severed = True

    def severing(self) -> bool:
        assert self.severed, "looked at before it was severed"
        self.looks += 1
        return self.polls is None or self.looks <= self.polls


def test_sever_returns_once_every_statement_has_noticed():
    quick, slow = Statement(0), Statement(5)
    asyncio.run(asyncio.wait_for(sever([quick, slow]), 10))
    assert quick.severed and slow.severed
    assert slow.looks == 6  # five more looks, then it had noticed, and sever returned


def test_sever_gives_up_on_a_statement_that_never_notices():
    stuck = Statement(None)
    asyncio.run(asyncio.wait_for(sever([stuck]), 10))
    assert stuck.severed and stuck.looks > 1

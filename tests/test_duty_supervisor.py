"""The supervisor of a worker's background duties (queueworker.runtime.supervisor.supervise): a
duty ends when it is cancelled, even when a step swallowed that cancellation, and a CancelledError
that does not come from cancelling the duty is an error like any other, after which it goes on."""

from __future__ import annotations

import asyncio
import logging

from queueworker.runtime.signals import WorkerSignals
from queueworker.runtime.supervisor import supervise

log = logging.getLogger("tests.duty_supervisor")


def test_a_duty_whose_step_swallows_its_cancellation_still_ends():
    """asyncio.wait_for on Python 3.11 returns what it waited for when its task is cancelled as that
    arrives: a step built on it (or on any code that catches the cancellation) returned normally,
    the duty went on, and the worker's shutdown, which waits for its duties, hung."""
    passes = 0

    async def swallowing_step() -> float:
        nonlocal passes
        passes += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if passes > 1:
                raise  # only the first: a duty that went on still ends when the test is over
        return 0.01  # what a swallowed cancellation looks like from the supervisor

    async def scenario() -> bool:
        duty = asyncio.create_task(supervise("swallowing", swallowing_step, log, WorkerSignals(), first_delay=0.0))
        while passes == 0:
            await asyncio.sleep(0.001)
        duty.cancel()
        done, _ = await asyncio.wait([duty], timeout=5)
        return bool(done) and duty.cancelled()

    assert asyncio.run(scenario()), "the duty went on after its cancellation"
    assert passes == 1


def test_a_cancelled_error_from_inside_a_step_is_an_error_and_the_duty_goes_on():
    """A step awaiting a future someone else cancelled gets a CancelledError that is not the duty's
    own cancellation: logged and counted as an error, and the duty passes again."""
    passes = 0

    async def step_with_a_cancelled_future() -> float:
        nonlocal passes
        passes += 1
        if passes == 1:
            future = asyncio.get_running_loop().create_future()
            future.cancel()
            await future
        return 0.001

    async def scenario() -> None:
        duty = asyncio.create_task(supervise("inner", step_with_a_cancelled_future, log, WorkerSignals(),
                                             first_delay=0.0, error_cap_seconds=0.01))
        while passes < 3:
            await asyncio.sleep(0.001)
        assert not duty.done()
        duty.cancel()
        await asyncio.gather(duty, return_exceptions=True)
        assert duty.cancelled()

    asyncio.run(scenario())

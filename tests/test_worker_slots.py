"""How many tasks a worker claims next (Worker._free_slots): the running handlers are bounded by
the concurrency, and the outcomes waiting for a flush by one flush batch while their results are
small, by the concurrency once they hold many result bytes (unit tier: nothing connects)."""

from __future__ import annotations

from types import SimpleNamespace

from queueworker.runtime.attempt import Attempt
from queueworker.runtime.completer import BACKLOG_RESULT_BYTES, Continued, Failure, Success
from queueworker.runtime.handlers import Registry
from queueworker.settings import WorkerSettings
from queueworker.runtime.worker import Worker


def _worker(concurrency: int, flush_max_batch: int, running: int, waiting: int) -> Worker:
    worker = Worker("postgresql://app@db.invalid/app", WorkerSettings(
        concurrency=concurrency, flush_max_batch=flush_max_batch), Registry())
    for key in range(running + waiting):
        worker._inflight[(key, 1)] = SimpleNamespace(reporting=key >= running)
    return worker


def test_running_handlers_never_exceed_the_concurrency():
    assert _worker(4, 1000, running=0, waiting=0)._free_slots() == 4
    assert _worker(4, 1000, running=3, waiting=0)._free_slots() == 1
    assert _worker(4, 1000, running=4, waiting=0)._free_slots() == 0


def test_small_outcomes_may_wait_a_whole_flush_batch_deep():
    assert _worker(4, 1000, running=0, waiting=500)._free_slots() == 4
    assert _worker(4, 1000, running=0, waiting=998)._free_slots() == 2
    assert _worker(4, 1000, running=1, waiting=999)._free_slots() == 1
    assert _worker(4, 1000, running=0, waiting=1000)._free_slots() == 0


def test_a_batch_smaller_than_the_concurrency_still_lets_every_slot_finish_once():
    assert _worker(100, 10, running=0, waiting=99)._free_slots() == 1
    assert _worker(100, 10, running=0, waiting=100)._free_slots() == 0


def test_outcomes_holding_many_result_bytes_wait_no_deeper_than_the_concurrency():
    worker = _worker(4, 1000, running=0, waiting=3)
    worker.completer.buffered_result_bytes = BACKLOG_RESULT_BYTES
    assert worker._free_slots() == 1
    worker.completer.buffered_result_bytes = BACKLOG_RESULT_BYTES - 1
    assert worker._free_slots() == 4


def test_the_completer_counts_the_result_bytes_it_holds():
    worker = _worker(4, 2, running=0, waiting=0)
    completer = worker.completer

    def attempt(task_id: int) -> Attempt:
        return Attempt(task_id, 1, "default", "t", "{}", 1, 3, 0.0, None, 0.0)  # type: ignore[arg-type]

    completer.succeed(attempt(1), '"' + "x" * 98 + '"')
    completer.succeed(attempt(2), None)
    completer.continue_with(attempt(3), "[1]", '{"page": 2}', 0.0)
    completer.fail(attempt(4), True, 1.0, {"type": "E", "message": "m"})
    assert completer.buffered_result_bytes == 100 + 3 + 11
    taken = completer._take(Success)
    assert len(taken) == 2 and completer.buffered_result_bytes == 14
    completer._put_back(Success, taken)
    assert completer.buffered_result_bytes == 114
    completer._take(Continued)
    completer._take(Failure)
    assert completer.buffered_result_bytes == 100

"""queueworker: a Postgres lease queue, its worker process and producer API.

What applications import:

- `task`, `TaskContext`, `RunInfo`, `PermanentError`: write handlers (`@task`), see the attempt
  they run (and `ctx.run`, the partitioned run it belongs to), fail a task without retries.
- `Continue`, `Snooze`, `RetryAfter`: a handler returns the first to succeed and enqueue the next
  page in the same statement; raises the others to wait without spending an attempt, or to be
  retried after a given delay.
- `enqueue`, `enqueue_many`, `enqueue_chain` and their `_async` twins, `TaskSpec`: add tasks
  inside the caller's transaction (unique, or depending on other tasks, as TaskSpec says); bad
  input raises pydantic's `ValidationError` before the database is touched.
- `get_task`, `TaskInfo`, `wait_for`: a task as stored now (state, progress, result or error), or
  once it has finished (`notify_on_finish=True` when enqueueing makes that immediate).
- `cancel`, `cancel_many`, `retry`: cancel unfinished tasks (a running one's handler is stopped at
  once); put a failed or cancelled one back to pending.
  `queueworker.operations` also pauses and resumes queues, rate-limits them, caps their running
  tasks and sets their circuit breakers (docs/flow-control.md).
- `start_run`: a partitioned run, counted as its partitions end, consolidated once if all succeed.
- `periodic` (or `@task(cron=...)`): a task enqueued at every slot of a cron expression in a time
  zone, exactly once however many workers run; `queueworker cron` adds schedules at runtime
  (docs/cron.md).
- `WorkerSettings`, `SettingsError`: a worker's settings, every default and bound in one place
  (the CLI's flags and QUEUEWORKER_* variables are derived from it).
- `Worker`, `run_worker`, `run_worker_async`, `Registry`: run a worker inside an application (sync,
  or on the application's asyncio loop), with the default registry that `@task` fills or one of
  its own (`registry.task`); the CLI's `worker` command runs through `run_worker` too
  (docs/embedding.md).
"""

import importlib

from ._version import __version__

# Where each public name lives. Imported on first use (PEP 562), so a command, a producer or a
# handler module loads only what it touches: `import queueworker` alone costs a few milliseconds,
# and the worker runtime is never loaded by a process that only enqueues.
_PUBLIC = {
    "Continue": "runtime.handlers", "PermanentError": "runtime.handlers", "Registry": "runtime.handlers",
    "RetryAfter": "runtime.handlers", "RunInfo": "runtime.handlers", "Snooze": "runtime.handlers",
    "TaskContext": "runtime.handlers", "task": "runtime.handlers",
    "periodic": "client.cron",
    "TaskSpec": "client.producer", "enqueue": "client.producer", "enqueue_async": "client.producer",
    "enqueue_chain": "client.producer", "enqueue_chain_async": "client.producer",
    "enqueue_many": "client.producer", "enqueue_many_async": "client.producer", "start_run": "client.producer",
    "cancel": "client.operations", "cancel_many": "client.operations", "retry": "client.operations",
    "TaskInfo": "client.results", "get_task": "client.results", "wait_for": "client.results",
    "SettingsError": "settings", "WorkerSettings": "settings",
    "Worker": "runtime.worker", "run_worker": "runtime.worker", "run_worker_async": "runtime.worker",
}

__all__ = ["__version__", *sorted(_PUBLIC)]


def __getattr__(name: str) -> object:
    """A public name, imported from its module when first used and kept here afterwards."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'queueworker' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})

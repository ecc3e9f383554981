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
  (docs/embedding.md). Imported on first use, so producers do not load the worker.
"""

from ._version import __version__  # noqa: E402

from .runtime.handlers import Continue, PermanentError, Registry, RetryAfter, RunInfo, Snooze, TaskContext, task  # noqa: E402
from .client.cron import periodic  # noqa: E402
from .client.producer import TaskSpec, enqueue, enqueue_async, enqueue_chain, enqueue_chain_async, enqueue_many, enqueue_many_async, start_run
from .client.operations import cancel, cancel_many, retry  # noqa: E402
from .client.results import TaskInfo, get_task, wait_for  # noqa: E402
from .settings import SettingsError, WorkerSettings  # noqa: E402

__all__ = ["__version__", "Continue", "PermanentError", "Registry", "RetryAfter", "RunInfo", "SettingsError", "Snooze", "TaskContext",
           "TaskInfo", "TaskSpec", "WorkerSettings", "cancel", "cancel_many", "enqueue", "enqueue_async",
           "enqueue_chain", "enqueue_chain_async", "enqueue_many", "enqueue_many_async", "get_task", "periodic",
           "retry", "start_run",
           "task", "wait_for", "Worker", "run_worker", "run_worker_async"]

_WORKER_NAMES = ("Worker", "run_worker", "run_worker_async")


def __getattr__(name: str) -> object:
    """The worker's names, imported when first used (PEP 562)."""
    if name in _WORKER_NAMES:
        from .runtime import worker

        return getattr(worker, name)
    raise AttributeError(f"module 'queueworker' has no attribute {name!r}")

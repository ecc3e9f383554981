"""queueworker: a Postgres lease queue, its worker process and producer API."""

__version__ = "0.1.0"

from .handlers import PermanentError, TaskContext, task  # noqa: E402
from .producer import TaskSpec, enqueue, enqueue_async, enqueue_many, enqueue_many_async  # noqa: E402

__all__ = ["PermanentError", "TaskContext", "TaskSpec", "enqueue", "enqueue_async", "enqueue_many",
           "enqueue_many_async", "task"]

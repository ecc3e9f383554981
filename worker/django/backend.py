"""The task backend Django's `TASKS` setting names, and the handler that runs Django tasks in a
queueworker worker (docs/django.md).

A Django task is one queueworker task named DJANGO_TASK whose payload says which Django task to call
and with what: `{"task": "app.tasks.send_mail", "args": [...], "kwargs": {...}}`. One task name
for all of them keeps the worker's registry as it is; the worker imports the named function only if
it is a Django `Task` (`@task`), so a producer cannot make it call anything else.
"""

from __future__ import annotations

import asyncio
import json
from inspect import iscoroutinefunction
from typing import Any

import psycopg

from ..client.inspect import task_events
from ..client.producer import TaskSpec, enqueue_many
from ..client.results import TaskInfo, get_task
from ..runtime.handlers import PermanentError, Registry, TaskContext
from .framework import (BaseTaskBackend, InvalidTask, Task, TaskContext as DjangoTaskContext, TaskError,
                        TaskResult, TaskResultDoesNotExist, TaskResultStatus, task_enqueued)

DJANGO_TASK = "django.task"

# queueworker's states as Django's statuses: waiting in any way is READY.
STATUSES = {"pending": "READY", "retrying": "READY", "blocked": "READY", "running": "RUNNING",
            "succeeded": "SUCCESSFUL", "failed": "FAILED", "cancelled": "FAILED"}


class DjangoTaskFailed(Exception):
    """What a worker records when a Django task raised: the exception's class path leads the message
    (Django's TaskError.exception_class_path), and the traceback the original's."""


class QueueWorkerBackend(BaseTaskBackend):
    """`TASKS = {"default": {"BACKEND": "queueworker.django.QueueWorkerBackend", "OPTIONS": {...}}}`.

    OPTIONS: `dsn`, a Postgres URL of its own (default: none, the Django database `database`, which
    must be Postgres through psycopg 3); `database`, that database's alias (default "default");
    `max_attempts`, how often a failing task runs before it is FAILED (default 1: Django's tasks run
    once, as they do with Django's own backends).

    Through Django's database, a task enqueued inside `transaction.atomic()` is inserted in that
    transaction: it exists once it commits, and not at all if it rolls back. With a `dsn` of its
    own, the enqueue waits for the commit (`transaction.on_commit`) and the result's id is known
    from then on; outside a transaction it is enqueued at once either way.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = set(self.options) - {"dsn", "database", "max_attempts"}
        if unknown:
            raise _improperly(f"unknown OPTIONS of {alias!r}: {', '.join(sorted(unknown))} (known: dsn, database, "
                              "max_attempts)")
        self.dsn: str | None = self.options.get("dsn")
        self.database: str = self.options.get("database", "default")
        self.max_attempts: int = self.options.get("max_attempts", 1)
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise _improperly(f"OPTIONS max_attempts of {alias!r} is a whole number of at least 1, "
                              f"not {self.max_attempts!r}")

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        from django.db import transaction

        self.validate_task(task)
        args, kwargs = _json_data(args, "args"), _json_data(kwargs, "kwargs")
        try:
            spec = TaskSpec(task=DJANGO_TASK, payload={"task": task.module_path, "args": args, "kwargs": kwargs},
                            queue=task.queue_name, priority=task.priority, run_after=task.run_after,
                            max_attempts=self.max_attempts)
        except ValueError as exc:  # a queue name queueworker refuses, a payload too big, ...
            raise InvalidTask(str(exc)) from None
        result = TaskResult(task=task, id="", status=TaskResultStatus.READY, enqueued_at=None, started_at=None,
                            last_attempted_at=None, finished_at=None, args=args, kwargs=kwargs, backend=self.alias,
                            errors=[], worker_ids=[])

        def insert(conn: psycopg.Connection) -> None:
            task_id = enqueue_many(conn, [spec])[0]
            object.__setattr__(result, "id", str(task_id))
            object.__setattr__(result, "enqueued_at", _now())
            task_enqueued.send(type(self), task_result=result)

        if self.dsn is None:
            insert(self._django_connection())  # in Django's transaction, if one is open
        else:
            transaction.on_commit(lambda: self._with_own_connection(insert), using=self.database)
        return result

    def get_result(self, result_id: str) -> Any:
        try:
            task_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None

        def read(conn: psycopg.Connection) -> tuple[TaskInfo | None, list]:
            info = get_task(conn, task_id)
            return info, [] if info is None else task_events(conn, task_id)

        if self.dsn is None:
            info, events = read(self._django_connection())
        else:
            info, events = self._with_own_connection(read)
        if info is None or info.task != DJANGO_TASK:
            raise TaskResultDoesNotExist(result_id)
        return _task_result(info, events, self.alias)

    def _django_connection(self) -> psycopg.Connection:
        from django.db import connections

        connection = connections[self.database]
        if connection.vendor != "postgresql":
            raise _improperly(f"the task backend {self.alias!r} enqueues through the Django database "
                              f"{self.database!r}, which is {connection.vendor}, not Postgres: give it a dsn")
        connection.ensure_connection()
        raw = connection.connection
        if not isinstance(raw, psycopg.Connection):
            raise _improperly(f"the Django database {self.database!r} uses psycopg2: queueworker needs psycopg 3 "
                              "(pip install 'psycopg[binary]'), or give the task backend a dsn")
        return raw

    def _with_own_connection(self, use: Any) -> Any:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return use(conn)


def register_django_tasks(registry: Registry) -> None:
    """Registers the handler of DJANGO_TASK: Django must be set up (django.setup()) first."""
    registry.register(run_django_task, DJANGO_TASK)


def run_django_task(payload: Any, ctx: TaskContext) -> Any:
    """Calls the Django task the payload names, with its arguments (and Django's TaskContext if it
    takes one); its return value becomes the task's result."""
    from django.db import close_old_connections
    from django.utils.module_loading import import_string

    if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
        raise PermanentError("a Django task's payload names the task: {\"task\": \"module.function\", ...}")
    path = payload["task"]
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise PermanentError(f"the arguments of {path} are a list and an object")
    try:
        task = import_string(path)
    except ImportError as exc:
        raise PermanentError(f"no Django task {path}: {exc}") from None
    if not isinstance(task, Task):
        raise PermanentError(f"{path} is not a Django task (@task)")
    if task.takes_context:
        running = TaskResult(task=task, id=str(ctx.task_id), status=TaskResultStatus.RUNNING, enqueued_at=None,
                             started_at=_now(), last_attempted_at=_now(), finished_at=None, args=args, kwargs=kwargs,
                             # One entry per attempt, as Django counts attempts (TaskContext.attempt).
                             backend=task.backend, errors=[], worker_ids=["queueworker"] * ctx.attempt)
        args = [DjangoTaskContext(task_result=running), *args]
    close_old_connections()  # as Django does around a request: a connection the database dropped goes
    try:
        if iscoroutinefunction(task.func):
            value = asyncio.run(task.acall(*args, **kwargs))
        else:
            value = task.call(*args, **kwargs)
    except Exception as exc:
        kind = type(exc)
        raise DjangoTaskFailed(f"{kind.__module__}.{kind.__qualname__}: {exc}") from exc
    finally:
        close_old_connections()
    return _json_data(value, "the return value")


def _task_result(info: TaskInfo, events: list, alias: str) -> Any:
    from django.utils.module_loading import import_string

    task = import_string(info.payload["task"])
    status = TaskResultStatus[STATUSES[info.state]]
    errors = []
    if status == TaskResultStatus.FAILED and isinstance(info.error, dict):
        message = str(info.error.get("message", ""))
        path = message.split(":", 1)[0] if info.error.get("type") == DjangoTaskFailed.__name__ else (
            f"queueworker.{info.error.get('type', 'Error')}")
        errors.append(TaskError(exception_class_path=path, traceback=str(info.error.get("traceback", message))))
    workers = [str(e.worker) for e in events if e.to_state == "running" and e.worker is not None]
    result = TaskResult(task=task, id=str(info.id), status=status, enqueued_at=info.created_at,
                        started_at=info.started_at, last_attempted_at=info.started_at,
                        finished_at=info.finished_at, args=info.payload.get("args", []),
                        kwargs=info.payload.get("kwargs", {}), backend=alias, errors=errors, worker_ids=workers)
    object.__setattr__(result, "_return_value", info.result)
    return result


def _json_data(value: Any, what: str) -> Any:
    """`value` as JSON gives it back (tuples become lists), or InvalidTask saying what is not JSON."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidTask(f"{what} must be JSON: {exc}") from None


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()


def _improperly(message: str) -> Exception:
    from django.core.exceptions import ImproperlyConfigured

    return ImproperlyConfigured(message)

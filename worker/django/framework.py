"""Django's tasks framework, wherever it lives: `django.tasks` from Django 6, else the `django-tasks`
backport (`django_tasks`) on Django 5.2. The two differ in module name and in the name of the
exception for an invalid task; everything queueworker uses is otherwise the same."""

from __future__ import annotations

try:
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (DEFAULT_TASK_QUEUE_NAME, Task, TaskContext, TaskError, TaskResult,
                                   TaskResultStatus)
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2 with the backport
    try:
        from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
        from django_tasks.base import (DEFAULT_TASK_QUEUE_NAME, Task, TaskContext,  # type: ignore[no-redef]
                                       TaskError, TaskResult, TaskResultStatus)
        from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]
        from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]
        from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef]
    except ImportError as exc:
        raise ImportError("queueworker.django needs Django 6 (django.tasks), or Django 5.2 with the django-tasks "
                          "backport: pip install 'queueworker[django]'") from exc

__all__ = ["DEFAULT_TASK_QUEUE_NAME", "BaseTaskBackend", "InvalidTask", "Task", "TaskContext", "TaskError",
           "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "task_enqueued", "task_finished",
           "task_started"]

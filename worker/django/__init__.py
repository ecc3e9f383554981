"""queueworker as a backend of Django's tasks framework (`django.tasks`, Django 6; the `django-tasks`
backport on Django 5.2): docs/django.md.

    TASKS = {"default": {"BACKEND": "queueworker.django.QueueWorkerBackend", "OPTIONS": {}}}

`@task` functions then enqueue into queueworker, and `queueworker worker --django SETTINGS_MODULE`
runs them. The names below are imported on first use, so that `import queueworker.django` needs
Django only once a backend is made.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DJANGO_TASK", "QueueWorkerBackend", "register_django_tasks"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

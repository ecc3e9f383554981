"""Settings of the test site: the database from $QUEUEWORKER_DJANGO_DSN (a queueworker database), and
its tasks on queueworker through Django's own database connection."""

import os

from psycopg.conninfo import conninfo_to_dict

try:
    import django.tasks  # noqa: F401 - Django 6: the framework is Django's own
    INSTALLED_APPS: list[str] = []
except ImportError:
    INSTALLED_APPS = ["django_tasks"]  # the backport, on Django 5.2

_url = conninfo_to_dict(os.environ["QUEUEWORKER_DJANGO_DSN"])
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": _url.get("dbname"),
                         "USER": _url.get("user"), "PASSWORD": _url.get("password"), "HOST": _url.get("host"),
                         "PORT": _url.get("port")}}
TASKS = {"default": {"BACKEND": "queueworker.django.QueueWorkerBackend", "QUEUES": [], "OPTIONS": {}}}
SECRET_KEY = "queueworker-tests-only"
USE_TZ = True

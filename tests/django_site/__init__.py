"""A Django site whose tasks run on queueworker (tests/test_django.py), under Django 6's django.tasks
or Django 5.2 with the django-tasks backport, whichever the Python running it has."""

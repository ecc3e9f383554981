"""The site's tasks."""

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task()
def add(a, b):
    return a + b


@task(priority=10, queue_name="reports")
def explode(message):
    raise ValueError(message)


@task(takes_context=True)
def describe(context, note):
    return {"attempt": context.attempt, "id": context.task_result.id, "note": note}

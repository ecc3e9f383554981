"""What the test asks of the site, in a process of its own (Django's settings are global): `enqueue`
prints the ids of what it enqueued (one inside a transaction that commits, one inside a transaction
that rolls back), `results ID...` prints what get_result says of each, as JSON lines."""

import json
import sys
from datetime import timedelta

import django

django.setup()

from django.db import transaction  # noqa: E402 - after setup
from django.utils import timezone  # noqa: E402

from tests.django_site import tasks  # noqa: E402


class RolledBack(Exception):
    pass


def enqueue() -> dict:
    ids = {"add": tasks.add.enqueue(2, 3).id, "explode": tasks.explode.enqueue("boom").id,
           "later": tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1).id}
    with transaction.atomic():
        ids["describe"] = tasks.describe.enqueue(note="committed").id
    try:
        with transaction.atomic():
            ids["rolled_back"] = tasks.add.enqueue(40, 2).id
            raise RolledBack
    except RolledBack:
        pass
    return ids


def results(ids: list[str]) -> list[dict]:
    found = []
    backend = tasks.add.get_backend()
    for result_id in ids:
        try:
            result = backend.get_result(result_id)
        except Exception as exc:  # TaskResultDoesNotExist, wherever the framework lives
            found.append({"id": result_id, "status": type(exc).__name__})
            continue
        found.append({"id": result.id, "status": str(result.status), "task": result.task.module_path,
                      "args": result.args, "kwargs": result.kwargs, "attempts": result.attempts,
                      "return_value": result.return_value if result.status == "SUCCESSFUL" else None,
                      "errors": [(e.exception_class_path, e.traceback) for e in result.errors]})
    return found


if __name__ == "__main__":
    print(json.dumps(enqueue() if sys.argv[1] == "enqueue" else results(sys.argv[2:])))

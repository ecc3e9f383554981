"""The handler the SQL producer examples (examples/producers/) enqueue for."""

from queueworker import task


@task(name="emails.send_welcome")
def send_welcome(payload):
    return {"sent_to": payload["user_id"]}

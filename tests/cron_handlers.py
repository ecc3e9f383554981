"""Schedules declared in code, for the worker processes of tests/test_cron.py: a handler that runs
every second (`@task(cron=...)`, six fields: seconds last) and a `periodic` schedule of a built-in
task."""

from queueworker import periodic, task


@task(name="cron.tick", cron="* * * * * *", catch_up="all")
def tick(payload):
    return payload


periodic("cron.code-minutely", "* * * * *", "qw.noop", payload={"from": "code"}, queue="cron-code")

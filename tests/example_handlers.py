"""Handlers used by tests, registered the way a user module registers them."""

import asyncio

from queueworker import PermanentError, task


@task
def add(payload, ctx):
    if "a" not in payload:
        raise PermanentError("need a and b")
    return {"sum": payload["a"] + payload["b"], "attempt": ctx.attempt}


@task(name="example.shout")
async def shout(payload):
    await asyncio.sleep(0)
    return payload["text"].upper()


@task
def unserialisable(payload):
    return object()

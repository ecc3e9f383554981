"""The channels queueworker notifies on, listening to one, and the notifications that are not
part of another statement: a listener's self-check, a queue's wake-up, and the LISTENs on fixed
channels. The statements are in notify.sql.

A channel's name is part of the statements that notify on it (pg_notify('queueworker', ...) in
lease.sql, duties.sql, ...) and of the migrations' functions: the names below are what a listener
LISTENs to, and must stay in step with them."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from .statements import NoParams, Params, SqlFile, Statement

_SQL = SqlFile("notify")

# Tasks became claimable: payload `queue` (due now) or `queue <epoch>` (a batch due then; the
# scheduler admits it), from every statement that enqueues, promotes, releases or rescues tasks.
NOTIFY_CHANNEL = "queueworker"
# A running task was cancelled: payload `worker-id task-id lease-token`, for the worker holding it.
# Like every channel here, open to any login's NOTIFY: a notification is a hint that makes its
# listener look at the database (docs/architecture.md, "Notifications are hints"), never an order.
CANCEL_CHANNEL = "queueworker_cancel"
# A queue's flow-control settings changed (payload: the queue): workers re-read them.
QUEUES_CHANNEL = "queueworker_queues"
# A cron schedule was added, changed, paused, resumed or deleted (payload: its name): the workers'
# cron duties look again. Moving a schedule's next slot on tells nobody: it only makes it due later.
CRON_CHANNEL = "queueworker_cron"
# A task enqueued with notify_on_finish ended (payload: its id): what `wait_for` listens to.
FINISHED_CHANNEL = "queueworker_finished"


class NotifyCheckParams(Params):
    channel: str


class NotifyQueueParams(Params):
    queue: str


async def listen(conn: psycopg.AsyncConnection[Any], channel: str) -> None:
    """LISTEN to `channel` on `conn`. The channel is a name, not a parameter: it goes into the
    statement itself, quoted as an identifier (every channel name here is lower case, as the
    unquoted name would be)."""
    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


async def unlisten(conn: psycopg.AsyncConnection[Any], channel: str) -> None:
    await conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))


async def unlisten_all(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("UNLISTEN *")


# How long a notification a listener sends itself may take to arrive before LISTEN is judged not
# to work: milliseconds on a direct connection, never through a transaction pooler. A worker counts
# it on its duty connection's idle clock (queueworker.runtime.listener).
LISTEN_CHECK_SECONDS = 5.0

# Runs a statement for its effect on a connection of its own: DutyConnection.execute, or the like.
Send = Callable[[Statement[NotifyCheckParams, Any], NotifyCheckParams], Awaitable[Any]]


def check_channel() -> str:
    """A channel of its own for one check that notifications arrive."""
    return f"queueworker_check_{uuid.uuid4().hex}"


async def notifications_arrive(conn: psycopg.AsyncConnection, send: Send) -> bool:
    """Whether NOTIFYs reach `conn` (autocommit, not listening to anything yet): it listens on a
    channel of its own, to which `send` (another connection's statement runner) notifies once.
    (A worker checks its duty connection without holding it: runtime.listener.)"""
    channel = check_channel()
    await listen(conn, channel)
    await send(NOTIFY_CHECK, NotifyCheckParams(channel=channel))
    arrived = False
    async for notify in conn.notifies(timeout=LISTEN_CHECK_SECONDS):
        if notify.channel == channel:
            arrived = True
            break  # the generator holds the connection until the loop has ended
    if arrived:
        await unlisten(conn, channel)
    return arrived


NOTIFY_CHECK = _SQL.statement("notify_check", NotifyCheckParams)
NOTIFY_QUEUE = _SQL.statement("notify_queue", NotifyQueueParams)
LISTEN_ANNOUNCEMENTS = _SQL.statement("listen_announcements", NoParams)
LISTEN_FINISHED = _SQL.statement("listen_finished", NoParams)
UNLISTEN_FINISHED = _SQL.statement("unlisten_finished", NoParams)

_SQL.check_all_declared()

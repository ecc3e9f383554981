"""Notifications that are not part of another statement: the listener's self-check and a queue's wake-up. The statements are in notify.sql."""

from __future__ import annotations


from .statements import Params, SqlFile

_SQL = SqlFile("notify")


class NotifyCheckParams(Params):
    channel: str


class NotifyQueueParams(Params):
    queue: str


NOTIFY_CHECK = _SQL.statement("notify_check", NotifyCheckParams)
NOTIFY_QUEUE = _SQL.statement("notify_queue", NotifyQueueParams)

_SQL.check_all_declared()

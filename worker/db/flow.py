"""Flow control (migration 009): queue settings (queueworker.client.operations), the worker's view of
them and circuit breakers (queueworker.runtime.flow). The statements are in flow.sql."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from .statements import Params, SqlFile

_SQL = SqlFile("flow")


class PauseQueueParams(Params):
    queue: str
    until: datetime | str
    wake_at: datetime | None
    wake: bool


class QueueRow(NamedTuple):
    name: str
    paused: bool
    paused_until: datetime | None  # None while paused until resumed
    rate_per_second: float | None
    burst: int | None
    max_running: int | None
    breaker_failures: int | None
    breaker_cooldown_seconds: float | None
    breaker_state: str
    consecutive_failures: int
    breaker_changed_at: datetime | None
    limited: bool


class ResumeQueueParams(Params):
    queue: str
    wake_at: datetime | None
    wake: bool


class LimitQueueParams(Params):
    queue: str
    rate: float | None
    burst: int | None
    max_running: int | None
    wake_at: datetime | None
    wake: bool


class BreakerQueueParams(Params):
    queue: str
    failures: int | None
    cooldown: float | None
    wake_at: datetime | None
    wake: bool


class QueueSettingsParams(Params):
    queue: str | None


class LimitedQueuesParams(Params):
    queues: list[str]


class LimitedQueueRow(NamedTuple):
    name: str
    rate_per_second: float | None
    has_breaker: bool
    breaker_state: str
    limited: bool  # flow control: claimed under the queue's row lock
    keyed: bool  # fair share across its keys (migration 020)


class RecordBreakerParams(Params):
    any_succeeded: bool
    trailing_failures: int
    queue: str


class BreakerRow(NamedTuple):
    was: str
    now_state: str


class SetKeyWeightParams(Params):
    queue: str
    key: str
    weight: float


class KeyParams(Params):
    queue: str
    key: str


class KeyWeightRow(NamedTuple):
    """A key's weight in its queue's fair share: `weight` claims per turn."""

    queue: str
    key: str
    weight: float


PAUSE_QUEUE = _SQL.statement("pause_queue", PauseQueueParams, QueueRow)
RESUME_QUEUE = _SQL.statement("resume_queue", ResumeQueueParams, QueueRow)
LIMIT_QUEUE = _SQL.statement("limit_queue", LimitQueueParams, QueueRow)
BREAKER_QUEUE = _SQL.statement("breaker_queue", BreakerQueueParams, QueueRow)
QUEUE_SETTINGS = _SQL.statement("queue_settings", QueueSettingsParams, QueueRow)
LIMITED_QUEUES = _SQL.statement("limited_queues", LimitedQueuesParams, LimitedQueueRow)
RECORD_BREAKER = _SQL.statement("record_breaker", RecordBreakerParams, BreakerRow)
SET_KEY_WEIGHT = _SQL.statement("set_key_weight", SetKeyWeightParams, KeyWeightRow)
CLEAR_KEY_WEIGHT = _SQL.statement("clear_key_weight", KeyParams, KeyWeightRow)

_SQL.check_all_declared()

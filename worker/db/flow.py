"""Flow control (migration 009; per key: 021; per-key breakers and key health: 022): queue settings
(queueworker.client.operations), the worker's view of them, circuit breakers and the keys' outcomes
(queueworker.runtime.flow). The statements are in flow.sql."""

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
    key_rate_per_second: float | None  # the defaults of every key of the queue (migration 021)
    key_burst: int | None
    key_max_running: int | None
    key_limited: bool  # a per-key default or some key's own limit: claimed by CLAIM_KEYS
    key_breaker_failures: int | None  # a circuit breaker per key (migration 022)
    key_breaker_cooldown_seconds: float | None


class ResumeQueueParams(Params):
    queue: str
    wake_at: datetime | None
    wake: bool


class LimitQueueParams(Params):
    queue: str
    rate: float | None
    burst: int | None
    max_running: int | None
    key_rate: float | None
    key_burst: int | None
    key_max_running: int | None
    wake_at: datetime | None
    wake: bool


class BreakerQueueParams(Params):
    queue: str
    failures: int | None
    cooldown: float | None
    wake_at: datetime | None
    wake: bool


class KeyBreakerQueueParams(Params):
    queue: str
    failures: int | None
    cooldown: float | None


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
    key_limited: bool  # per-key limits (migration 021): claimed by CLAIM_KEYS
    has_key_breaker: bool  # a circuit breaker per key (migration 022)
    key_breakers_open: int | None  # keys whose breaker is open or half-open, with a per-key breaker
    fastest_key_rate: float | None  # the fastest rate of a key's bucket, when key-limited
    probe_due_at: datetime | None  # when the first cooldown of a breaker not closed (the queue's, a key's) ends
    capped: bool  # a cap on running tasks may bind: the queue's, the keys' default, or a key's own


class RecordBreakerParams(Params):
    any_succeeded: bool
    trailing_failures: int
    queue: str


class BreakerRow(NamedTuple):
    was: str
    now_state: str


class RecordKeyOutcomesParams(Params):
    """One report of a worker's outcomes for the keys of a key-limited queue: per key ('' for the
    tasks without one), whether any succeeded and the failures after the last success."""

    queue: str
    keys: list[str]
    any_succeeded: list[bool]
    trailing_failures: list[int]


class KeyBreakerRow(NamedTuple):
    key: str
    now_state: str
    changed: bool  # this report moved the key's breaker to now_state


class SetKeyLimitsParams(Params):
    queue: str
    key: str
    weight: float | None
    rate: float | None
    burst: int | None
    max_running: int | None


class KeyParams(Params):
    queue: str
    key: str


class PauseKeyParams(Params):
    queue: str
    key: str
    until: datetime | str
    wake_at: datetime | None


class KeySettingsParams(Params):
    queue: str
    limit: int


class KeyRow(NamedTuple):
    """A key's own settings in its queue: its weight in the fair share (`weight` claims per turn;
    None: 1), its bucket and cap (None: the queue's per-key defaults), its pause (`paused_until`
    None while paused until resumed)."""

    queue: str
    key: str
    weight: float | None
    rate_per_second: float | None
    burst: int | None
    max_running: int | None
    paused_until: datetime | None
    paused: bool


PAUSE_QUEUE = _SQL.statement("pause_queue", PauseQueueParams, QueueRow)
RESUME_QUEUE = _SQL.statement("resume_queue", ResumeQueueParams, QueueRow)
LIMIT_QUEUE = _SQL.statement("limit_queue", LimitQueueParams, QueueRow)
BREAKER_QUEUE = _SQL.statement("breaker_queue", BreakerQueueParams, QueueRow)
KEY_BREAKER_QUEUE = _SQL.statement("key_breaker_queue", KeyBreakerQueueParams, QueueRow)
QUEUE_SETTINGS = _SQL.statement("queue_settings", QueueSettingsParams, QueueRow)
LIMITED_QUEUES = _SQL.statement("limited_queues", LimitedQueuesParams, LimitedQueueRow)
RECORD_BREAKER = _SQL.statement("record_breaker", RecordBreakerParams, BreakerRow)
RECORD_KEY_OUTCOMES = _SQL.statement("record_key_outcomes", RecordKeyOutcomesParams, KeyBreakerRow)
SET_KEY_LIMITS = _SQL.statement("set_key_limits", SetKeyLimitsParams, KeyRow)
CLEAR_KEY_LIMITS = _SQL.statement("clear_key_limits", KeyParams, KeyRow)
PAUSE_KEY = _SQL.statement("pause_key", PauseKeyParams, KeyRow)
RESUME_KEY = _SQL.statement("resume_key", KeyParams, KeyRow)
KEY_SETTINGS = _SQL.statement("key_settings", KeySettingsParams, KeyRow)

_SQL.check_all_declared()

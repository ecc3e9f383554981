"""The documented home of what operators and applications do to tasks and queues that exist:
cancel and retry tasks; pause, resume, rate-limit, cap and guard queues with a circuit breaker
(docs/flow-control.md). Implemented in `queueworker.client.operations`."""

from .client.operations import (
    CANCELLABLE, RetryRefused, cancel, cancel_many, parse_duration, parse_rate, pause, queue_settings, resume, retry,
    set_breaker, set_limits)

__all__ = ["CANCELLABLE", "RetryRefused", "cancel", "cancel_many", "parse_duration", "parse_rate", "pause",
           "queue_settings", "resume", "retry", "set_breaker", "set_limits"]

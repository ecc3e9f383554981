"""A worker's side of flow control (docs/flow-control.md): which of its queues are limited, and the
outcomes that feed their circuit breakers.

The limits themselves are enforced in the database, by `claim_limited` under the queue's row lock
(taken by `lock_queue` in the same transaction, so the claim's snapshot sees the claim before it),
so they hold however many workers claim. A worker only has to pick that statement for a limited
queue (the plain `claim` claims nothing from one, so a worker that has not heard of a new limit yet
stays safe), come back when its bucket has a token again or a breaker's cooldown ends (its probe),
and report outcomes to the breaker, claiming nothing more from a queue while a failure it saw there
is not yet reported (that failure may be the one that opens the breaker). A keyed queue (fair share
across its keys, migration 020) is claimed in fair-share order (`claim_fair`, or
`claim_limited_fair` when it is limited too); the plain `claim` claims nothing from one either. A
key-limited queue (per-key limits and pauses, migration 021) is claimed by `claim_keys` after
`lock_keys`; every other claim takes nothing from it. Its outcomes are reported per key (the keys'
health, and their breakers when it has a per-key breaker, migration 022), one statement per queue
and report; while a failure of a key is not yet reported, this worker's claims pass over that key
(`held_keys`), and over that key only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime

from .. import metrics
from ..db.connection import DutyConnection
from ..db.flow import (LIMITED_QUEUES, RECORD_BREAKER, RECORD_KEY_OUTCOMES, LimitedQueueRow, LimitedQueuesParams,
                       RecordBreakerParams, RecordKeyOutcomesParams)
from ..db.lease import (CLAIM, CLAIM_FAIR, CLAIM_KEYS, CLAIM_LIMITED, CLAIM_LIMITED_FAIR, LOCK_KEYS, LOCK_QUEUE,
                        ClaimedRow, ClaimParams, LockQueueParams)
from ..db.statements import Bound, Statement
from .attempt import Attempt

log = logging.getLogger("queueworker.flow")

# Every change of a queue's settings notifies (queueworker.db.notify.QUEUES_CHANNEL), and a listener
# that (re)starts listening, or polls, has them re-read. Besides, they are re-read this often while one of the
# worker's queues has flow control (its breaker's state, which other workers' outcomes change
# without a notification, is exported)...
REFRESH_SECONDS = 5.0
# ...and this seldom while none has: for settings changed by hand in SQL (which tells no one), and
# should a listener connection die without the worker noticing.
SAFETY_REFRESH_SECONDS = 300.0
BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
# How often a worker reports the keys' health of a key-limited queue without a per-key breaker: the
# times it keeps are this exact, and a busy queue pays one statement per interval, not one per
# flush. A per-key breaker's outcomes are reported at once, as the queue breaker's.
HEALTH_REPORT_SECONDS = 1.0


class FlowControl:
    def __init__(self, conn: DutyConnection, queues: tuple[str, ...], on_change: Callable[[], None],
                 on_probe_due: Callable[[float], None]):
        self._conn = conn
        self._queues = list(queues)
        self.limited: dict[str, LimitedQueueRow] = {}
        self.keyed: frozenset[str] = frozenset()
        self.breaker_queues: frozenset[str] = frozenset()
        # Per queue with a breaker, outcomes since the last report: (any succeeded, failures since).
        self._outcomes: dict[str, tuple[bool, int]] = {}
        self._reporting: frozenset[str] = frozenset()  # queues whose failures are being reported now
        self.key_queues: frozenset[str] = frozenset()  # key-limited: outcomes reported per key
        self.capped_queues: frozenset[str] = frozenset()  # with a cap on running tasks (the queue's, a key's)
        self.key_breaker_queues: frozenset[str] = frozenset()  # with a breaker per key
        # Per key-limited queue, per key ('' for none), outcomes since the last report, as above.
        self._key_outcomes: dict[str, dict[str, tuple[bool, int]]] = {}
        self._reporting_keys: dict[str, frozenset[str]] = {}  # keys whose failures are being reported now
        self._health_due = 0.0  # event-loop time the keys' health is next reported
        self._refresh_due = 0.0  # event-loop time; a notification makes it now
        self._token_waits: dict[str, float] = {}  # per rate-limited queue: the wait after a claim that takes nothing
        self.wake = asyncio.Event()
        self._on_change = on_change  # limits changed, or failures were reported: claim again
        # Called with the epoch time a breaker's cooldown ends (a probe may be claimed then): a claim
        # then, not at the next idle poll. Each refresh passes on the times still to come (the timer
        # keeps the earliest), and once a time already past (the cooldown ended before the refresh).
        self._on_probe_due = on_probe_due
        self._probes_due: dict[str, datetime] = {}  # per queue, the cooldown end last passed on

    def claim_statements(self, queue: str) -> tuple[Bound[LockQueueParams] | None,
                                                      Statement[ClaimParams, ClaimedRow]]:
        """The statement that locks the queue first (None when nothing is limited), and the claim."""
        fair = queue in self.keyed
        settings = self.limited.get(queue)
        if settings is not None and settings.key_limited:
            return Bound(LOCK_KEYS, LockQueueParams(queue=queue)), CLAIM_KEYS
        if settings is not None:
            return Bound(LOCK_QUEUE, LockQueueParams(queue=queue)), CLAIM_LIMITED_FAIR if fair else CLAIM_LIMITED
        return None, CLAIM_FAIR if fair else CLAIM

    def token_interval(self, queue: str) -> float | None:
        """Seconds between tokens of a rate-limited queue, or of its fastest key's bucket: when a
        claim such a bucket may have cut short is worth trying again."""
        settings = self.limited.get(queue)
        rates = () if settings is None else [rate for rate in (settings.rate_per_second, settings.fastest_key_rate)
                                             if rate is not None]
        return 1.0 / max(rates) if rates else None

    def next_claim_in(self, queue: str, claimed: int, limit: int, longest_wait: float) -> float | None:
        """Seconds until a claim of `queue` that took `claimed` of `limit` tasks is worth trying again
        for the tokens of a rate-limited queue (None: not for them). A bucket may have cut it short: it
        comes back when the next token is due. A claim that took nothing may have found the bucket
        empty too (another worker took the token this one's timer was set for, or this one's slots
        were full when the token came): it comes back as well, after a wait that doubles with each
        claim that takes nothing, up to `longest_wait` (the longest idle poll), so an empty queue is
        not polled at its rate; a claim that takes something starts again from one token's time."""
        interval = self.token_interval(queue)
        if interval is None:
            self._token_waits.pop(queue, None)
            return None
        if claimed:
            self._token_waits[queue] = interval
            return interval if claimed < limit else None
        wait = self._token_waits.get(queue, interval)
        if wait > max(interval, longest_wait):
            return None
        self._token_waits[queue] = 2 * wait
        return wait

    def settings_changed(self) -> None:
        """A notification said a queue's settings changed: re-read them now."""
        self._refresh_due = 0.0
        self.wake.set()

    def note(self, queue: str, succeeded: bool) -> None:
        """An outcome of a task of a queue with a breaker (the completer calls this once written)."""
        any_succeeded, failures = self._outcomes.get(queue, (False, 0))
        self._outcomes[queue] = (True, 0) if succeeded else (any_succeeded, failures + 1)
        self.wake.set()

    def note_key(self, queue: str, key: str | None, succeeded: bool) -> None:
        """An outcome of a task of a key-limited queue (the completer calls this once written). A
        per-key breaker's is reported at once; the first outcome of the keys' health to wait for its
        report wakes the duty too, which then sleeps until that report is due."""
        first = not self._key_outcomes
        outcomes = self._key_outcomes.setdefault(queue, {})
        any_succeeded, failures = outcomes.get(key or "", (False, 0))
        outcomes[key or ""] = (True, 0) if succeeded else (any_succeeded, failures + 1)
        if first or queue in self.key_breaker_queues:
            self.wake.set()

    def held_keys(self, queue: str, inflight: Iterable[Attempt]) -> set[str]:
        """Keys of a queue with a per-key breaker whose failures seen by this worker the breaker has
        not counted yet (failed in `inflight`, written, or being reported): claims pass over them."""
        if queue not in self.key_breaker_queues:
            return set()
        held = {key for key, (_, failures) in self._key_outcomes.get(queue, {}).items() if failures}
        held.update(attempt.ctx.key or "" for attempt in inflight if attempt.failed and attempt.queue == queue)
        return held | self._reporting_keys.get(queue, frozenset())

    def breaker_pending(self, queue: str, inflight: Iterable[Attempt]) -> bool:
        """A failure of the queue is on its way to the queue's circuit breaker (failed in
        `inflight`, written, or being reported): claim nothing from it until the breaker has counted
        it, as it may be the one that opens it. `step` wakes the claims once it reported."""
        if queue not in self.breaker_queues:
            return False
        outcome = self._outcomes.get(queue)
        return ((outcome is not None and outcome[1] > 0) or queue in self._reporting
                or any(attempt.failed and attempt.queue == queue for attempt in inflight))

    async def step(self) -> float:
        """One pass of the flow duty: report breaker outcomes (the keys' health once its report is
        due), re-read settings when told to or when their refresh interval has passed. Reported
        failures wake the claims they held back, and so does a report that closed a breaker."""
        loop = asyncio.get_running_loop()
        closed = False
        outcomes, self._outcomes = self._outcomes, {}
        health_due = loop.time() >= self._health_due
        key_outcomes = {queue: keys for queue, keys in self._key_outcomes.items()
                        if health_due or queue in self.key_breaker_queues}
        self._key_outcomes = {queue: keys for queue, keys in self._key_outcomes.items()
                              if queue not in key_outcomes}
        self._reporting = frozenset(queue for queue, (_, failures) in outcomes.items() if failures)
        self._reporting_keys = {queue: frozenset(key for key, (_, failures) in keys.items() if failures)
                                for queue, keys in key_outcomes.items()}
        try:
            for queue, (any_succeeded, failures) in outcomes.items():
                closed = await self._report(queue, any_succeeded, failures) or closed
            for queue, keys in list(key_outcomes.items()):
                closed = await self._report_keys(queue, keys) or closed
                del key_outcomes[queue]
        except BaseException:
            for queue, outcome in outcomes.items():  # not reported: keep them for the next pass
                self._outcomes.setdefault(queue, outcome)
            for queue, keys in key_outcomes.items():
                for key, outcome in keys.items():
                    self._key_outcomes.setdefault(queue, {}).setdefault(key, outcome)
            raise
        finally:
            held = bool(self._reporting) or any(self._reporting_keys.values())
            self._reporting, self._reporting_keys = frozenset(), {}
        if held or closed:
            self._on_change()
        if health_due:
            self._health_due = loop.time() + HEALTH_REPORT_SECONDS
        if loop.time() >= self._refresh_due:
            await self.refresh()
            self._refresh_due = loop.time() + (REFRESH_SECONDS if self.limited else SAFETY_REFRESH_SECONDS)
        due = min(self._refresh_due, self._health_due) if self._key_outcomes else self._refresh_due
        return max(0.0, due - loop.time())

    async def refresh(self) -> None:
        rows = await self._conn.fetch(LIMITED_QUEUES, LimitedQueuesParams(queues=self._queues))
        known_due = self._probes_due
        limited = {row.name: row for row in rows if row.limited}
        keyed = frozenset(row.name for row in rows if row.keyed)
        changed = keyed != self.keyed or {name: self._claimed_as(row) for name, row in limited.items()} != {
            name: self._claimed_as(row) for name, row in self.limited.items()}
        self.limited, self.keyed = limited, keyed
        self.breaker_queues = frozenset(row.name for row in rows if row.has_breaker)
        self.key_queues = frozenset(row.name for row in rows if row.key_limited)
        self.capped_queues = frozenset(row.name for row in rows if row.capped)
        self.key_breaker_queues = frozenset(row.name for row in rows if row.has_key_breaker)
        self._probes_due = {row.name: row.probe_due_at for row in rows if row.probe_due_at is not None}
        for name, due in self._probes_due.items():
            if due.timestamp() > time.time() or due != known_due.get(name):
                self._on_probe_due(due.timestamp())
        for row in rows:
            if row.has_breaker:
                metrics.BREAKER_STATE.labels(row.name).set(BREAKER_STATES[row.breaker_state])
            if row.key_breakers_open is not None:
                metrics.KEY_BREAKERS_OPEN.labels(row.name).set(row.key_breakers_open)
        if changed:
            log.info("flow control on %s; fair share on %s", ", ".join(sorted(limited)) or "none of this worker's queues",
                     ", ".join(sorted(keyed)) or "none")
            self._on_change()

    @staticmethod
    def _claimed_as(row: LimitedQueueRow) -> tuple[float | None, bool, float | None]:
        """What decides how a limited queue is claimed and when a cut-short claim is tried again."""
        return row.rate_per_second, row.key_limited, row.fastest_key_rate

    async def _report(self, queue: str, any_succeeded: bool, failures: int) -> bool:
        """Whether the report closed the queue's breaker."""
        rows = await self._conn.fetch(RECORD_BREAKER, RecordBreakerParams(
            queue=queue, any_succeeded=any_succeeded, trailing_failures=failures))
        for row in rows:
            metrics.BREAKER_STATE.labels(queue).set(BREAKER_STATES[row.now_state])
            if row.now_state != row.was:
                metrics.BREAKER_TRANSITIONS.labels(queue, row.now_state).inc()
                log.warning("circuit breaker of queue %s: %s -> %s", queue, row.was, row.now_state,
                            extra={"queue": queue, "breaker_state": row.now_state})
        return any(row.was != "closed" and row.now_state == "closed" for row in rows)

    async def _report_keys(self, queue: str, outcomes: dict[str, tuple[bool, int]]) -> bool:
        """One statement for every key of the queue this report holds; whether it closed a key's breaker."""
        keys = sorted(outcomes)
        rows = await self._conn.fetch(RECORD_KEY_OUTCOMES, RecordKeyOutcomesParams(
            queue=queue, keys=keys, any_succeeded=[outcomes[key][0] for key in keys],
            trailing_failures=[outcomes[key][1] for key in keys]))
        for row in rows:
            if row.changed:
                metrics.KEY_BREAKER_TRANSITIONS.labels(queue, row.now_state).inc()
                log.warning("circuit breaker of key %r of queue %s: now %s", row.key, queue, row.now_state,
                            extra={"queue": queue, "breaker_state": row.now_state})
        return any(row.changed and row.now_state == "closed" for row in rows)

"""Prometheus metrics exported by a worker on --metrics-port."""

from __future__ import annotations

from functools import lru_cache

from prometheus_client import Counter, Gauge, Histogram

TASKS_CLAIMED = Counter("queueworker_tasks_claimed_total", "Tasks claimed by this worker", ["queue"])
TASKS_COMPLETED = Counter("queueworker_tasks_completed_total",
                          "Attempts reported, by outcome (succeeded, continued, snoozed, retried, failed)",
                          ["queue", "outcome"])
TASKS_RELEASED = Counter("queueworker_tasks_released_total",
                         "Leases handed back on shutdown without consuming an attempt", ["queue"])
STALE_COMPLETIONS = Counter("queueworker_stale_completions_total",
                            "Results discarded because the lease was no longer held (fencing token mismatch)")
LEASES_LOST = Counter("queueworker_leases_lost_total",
                      "Running attempts whose lease was lost (expired, cancelled, re-claimed) and were cancelled")
RUNNING_CANCELLED = Counter("queueworker_running_cancelled_total",
                            "Running attempts stopped because their task was cancelled", ["queue"])
DUTY_PASSES = Counter("queueworker_duty_passes_total", "Passes of each background duty, failed ones included",
                      ["duty"])
CLAIMS = Counter("queueworker_claims_total", "Claim statements sent (each may find no task)", ["queue"])
NOTIFICATIONS = Counter("queueworker_notifications_total",
                        "Notifications the listener heard, by channel and what came of them: a hint acted on "
                        "(a wake-up, or a look at the database), ignored (not for this worker, or naming "
                        "nothing it runs), or malformed", ["channel", "outcome"])
CANCEL_CHECKS = Counter("queueworker_cancel_checks_total",
                        "Statements that asked the database which running attempts were cancelled, because "
                        "a notification named them (notified) or because the worker cannot listen (polled)",
                        ["reason"])
CANCELS_UNCONFIRMED = Counter("queueworker_cancels_unconfirmed_total",
                              "Attempts this worker runs, named by cancellation notices, that a look at the "
                              "database did not show cancelled (forged or stale notices): their handlers went on")
LEASES_RECOVERED = Counter("queueworker_leases_recovered_total",
                           "Expired leases recovered by this worker's rescuer", ["outcome"])
TASKS_PROMOTED = Counter("queueworker_tasks_promoted_total",
                         "Retrying or delayed tasks admitted to the claim index when due")
TASK_DURATION = Histogram("queueworker_task_duration_seconds", "Handler run time per attempt", ["queue", "task"],
                          buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800))
IN_FLIGHT = Gauge("queueworker_tasks_in_flight", "Attempts holding a lease in this worker")
MOVED_ROW_RETRIES = Counter("queueworker_moved_row_retries_total",
                            "Statements re-run because a row they meant to change had just moved "
                            "between the active and finished partitions")
DB_ERRORS = Counter("queueworker_db_errors_total", "Database errors expected to heal (connection lost, server "
                    "restarting, timeouts), by operation", ["operation"])
UNEXPECTED_ERRORS = Counter("queueworker_unexpected_errors_total",
                            "Errors that are not expected to heal (bugs, bad rows, missing grants), by duty; "
                            "each is logged with its traceback", ["duty"])
ATTEMPTS_FENCED = Counter("queueworker_attempts_fenced_total",
                          "Attempts cancelled because their lease passed by this worker's own clock "
                          "(heartbeats failing): another worker may already run them")
UNSTORABLE_OUTCOMES = Counter("queueworker_unstorable_outcomes_total",
                              "Outcomes Postgres refused (result or error not storable); their tasks failed "
                              "permanently instead", ["queue"])
TASKS_DEFERRED = Counter("queueworker_tasks_deferred_total",
                         "Tasks handed back because no handler knows their name yet (rolling deploys)", ["queue"])
STUCK_HANDLER_THREADS = Gauge("queueworker_stuck_handler_threads",
                              "Threads of sync handlers that were told to stop (deadline, lost lease, drain) "
                              "and are still running")
EVENT_LOOP_LAG = Gauge("queueworker_event_loop_lag_seconds",
                       "How late the event loop answered the watchdog's last ping (a blocking async handler "
                       "shows here)")
EVENT_LOOP_BLOCKED = Counter("queueworker_event_loop_blocked_total",
                             "Times the event loop was blocked longer than the watchdog's threshold")
WORKER_STATE = Gauge("queueworker_worker_state", "1 for the fetch loop's current state", ["state"])
WORKER_STATE_TRANSITIONS = Counter("queueworker_worker_state_transitions_total",
                                   "Transitions of the fetch loop's state machine (docs/state-machine.md)",
                                   ["from_state", "to_state"])
CHECKPOINT_WRITES = Counter("queueworker_checkpoint_writes_total",
                            "ctx.save_checkpoint calls, by outcome: saved, or refused because the lease was gone",
                            ["queue", "outcome"])
BREAKER_STATE = Gauge("queueworker_breaker_state",
                      "Circuit breaker of a queue as this worker last saw it: 0 closed, 1 half-open, 2 open", ["queue"])
BREAKER_TRANSITIONS = Counter("queueworker_breaker_transitions_total",
                              "Circuit breaker state changes this worker's reports caused, by new state",
                              ["queue", "to_state"])
KEY_BREAKER_TRANSITIONS = Counter("queueworker_key_breaker_transitions_total",
                                  "State changes of per-key circuit breakers this worker's reports caused, by new "
                                  "state (no key label: the keys are unbounded)", ["queue", "to_state"])
KEY_TASKS = Gauge("queueworker_key_tasks", "With --key-metrics N: tasks ready and running of the N keys of each keyed "
                  "queue with the most tasks ready, as last read (key \"\": the tasks without a key)",
                  ["queue", "key", "state"])
KEY_BREAKERS_OPEN = Gauge("queueworker_key_breakers_open",
                          "Keys of a queue whose circuit breaker is open or half-open, as this worker last saw it",
                          ["queue"])
CRON_SLOTS_ENQUEUED = Counter("queueworker_cron_slots_enqueued_total",
                              "Slots of periodic schedules this worker enqueued (each slot is enqueued by one worker)",
                              ["job"])
TASKS_DELETED = Counter("queueworker_tasks_deleted_total", "Finished tasks deleted after the retention period")
HISTORY_DELETED = Counter("queueworker_history_deleted_total",
                          "Finished runs (with their events), queue events and idle keys' state deleted after the "
                          "retention period, and watermarks after the watermark retention, by kind: runs, "
                          "queue_events, key_states, watermarks",
                          ["kind"])


@lru_cache(maxsize=4096)
def task_duration(queue: str, task: str) -> Histogram:
    """The duration histogram's child for one queue and task, looked up once (a per-task hot path)."""
    return TASK_DURATION.labels(queue, task)

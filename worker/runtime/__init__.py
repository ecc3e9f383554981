"""The worker runtime: the lease loop (`worker`), the attempts it runs (`handlers`, `attempt`,
`external`, `builtin_tasks`), the completer that reports their outcomes, and the background duties
every worker runs under one supervisor (heartbeat, listener, rescuer, scheduler, cleaner, cron,
flow control, watchdog). Applications import what they need from `queueworker` itself."""

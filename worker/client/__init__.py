"""What applications import to use the queue without running a worker: enqueueing (`producer`),
reading tasks back (`results`; `inspect` as stored), acting on tasks and queues that exist
(`operations`), partitioned runs that exist (`runs`), periodic schedules (`cron`), and what the CLI
and the console show of them (`status`). The CLI and the console do every operation through these
modules. The public names are re-exported by `queueworker` itself."""

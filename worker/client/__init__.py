"""What applications import to use the queue without running a worker: enqueueing (`producer`),
reading tasks back (`results`), acting on tasks and queues that exist (`operations`), and what
the CLI and the console show of them (`status`). The public names are re-exported by
`queueworker` itself."""

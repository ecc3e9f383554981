"""Local development tools: a throwaway Postgres (`localpg`), a development database that outlives
the command (`devdb`), and `queueworker demo`."""

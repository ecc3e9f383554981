"""Nothing to set up: queueworker's pytest plugin brings the `queueworker_db` fixture."""

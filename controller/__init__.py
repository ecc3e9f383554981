"""queueworker controller."""

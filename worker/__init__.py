"""queueworker: a Postgres lease queue, its worker process and producer API."""

__version__ = "0.1.0"

"""The documented home of `migrate`, which creates or upgrades queueworker's schema (the examples
call it before they start). Implemented in `queueworker.db.migrate`."""

from .db.migrate import LockPolicy, MigrationBlocked, migrate

__all__ = ["LockPolicy", "MigrationBlocked", "migrate"]

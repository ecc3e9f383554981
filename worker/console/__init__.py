"""`queueworker console`: a web console over the queue's database (and, when it can reach it, the
QueueWorkers' scaling decisions). Read-only unless started with --allow-actions, which needs
credentials (docs/console.md)."""

from .app import ConsoleConfig, create_app
from .auth import CredentialsError, load_token

__all__ = ["ConsoleConfig", "CredentialsError", "create_app", "load_token"]

"""Runnable examples of queueworker's workflows (see each module's docstring)."""

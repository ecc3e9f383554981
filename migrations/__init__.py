"""SQL migrations, applied in file-name order by `queueworker migrate`."""

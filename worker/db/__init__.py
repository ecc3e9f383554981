"""The statement layer: every SQL statement queueworker runs, the connections that run them, and
the migrations that create the schema they run against."""

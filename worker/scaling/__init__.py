"""How many worker replicas a queue needs: the scaling policy, a pure function shared by the
controller (which scales Deployments) and `queueworker demo` (which scales local processes)."""

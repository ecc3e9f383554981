"""How many worker replicas a queue needs: the scaling policy, a pure function shared by the
controller (which scales Deployments) and `queueworker demo` (which scales local processes); and
the QueueWorker resource's names and status fields, shared by the controller and the console."""

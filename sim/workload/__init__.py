"""The task-graph IR (``sim.workload.ir``) and the emitters that turn a plan into a ``TaskGraph``."""

"""Replays of a task graph: the simpy event engine (the only simpy importer), the longest-path
evaluation, SM contention, and the critical path."""

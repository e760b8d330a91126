"""The output contract: the trace table, its summary, writers, and link usage."""

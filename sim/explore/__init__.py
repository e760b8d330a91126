"""Closed-form estimate, sweeps, layout search and their executors."""

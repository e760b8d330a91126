"""Collectives in closed form, the cluster topology, max-min flows, and the network models."""

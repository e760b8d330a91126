"""Model shapes and presets, per-layer operations, FLOPs and parameters, and memory (states, activations)."""

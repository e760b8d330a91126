"""The rank grid and model-chunk split, and pipeline schedules as pure action lists."""

"""Compute on part of a GPU's SMs: the one rule for SMs something else holds beside a compute kernel.

In: a kernel's seconds on all ``sms`` SMs and how many of them are held (a float, or an array: a mean over the
kernel's span). Out: its seconds on the rest. Used for NCCL's and DeepEP's kernels beside compute
(sim.engine.sm_contention) and for Transformer Engine's SM margin beside a pipelined reduce-scatter
(sim.workload.tp_overlap.beside_reduce_scatter).

Why: a large GEMM's tiles each need a whole SM, so while ``n`` of ``S`` SMs run something else it computes at
``(S - n) / S`` of its rate and takes ``seconds / (1 - n / S)`` (docs/mechanisms/collectives_at_scale.md); at least
one SM keeps computing.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def on_fewer_sms(seconds: Any, held: Any, sms: int) -> Any:
    """Seconds of a kernel of ``seconds`` (on all ``sms`` SMs) while ``held`` of the SMs run something else."""
    return seconds / (1.0 - np.minimum(held, sms - 1) / sms)

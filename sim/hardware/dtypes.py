"""Training dtypes: what an element of one weighs, which dtype parameters are kept in.

In: a dtype name (``fp32``, ``tf32``, ``fp16``, ``bf16``, ``fp8``). Out: bytes per element, and the dtype of the
working parameters and their gradients.
"""

from __future__ import annotations


def parameter_dtype(dtype: str) -> str:
    """The dtype a training dtype keeps its (working) parameters and their gradients in: its own, except FP8,
    whose GEMMs Transformer Engine runs in FP8 from bf16 weights (amax-scaled casts), so the parameters, their
    gradients and every reduction stay bf16; and TF32, a GEMM mode of fp32 parameters."""
    return {"fp8": "bf16", "tf32": "fp32"}.get(dtype, dtype)


def bytes_per_element(dtype: str) -> int:
    """Bytes of an activation/weight element in the compute dtype (fp8 keeps bf16 activations and weights)."""
    return 4 if dtype in ("fp32", "tf32") else 2

"""FP8 training's cast and transpose kernels around each Transformer Engine linear GEMM.

In: a linear ``Op`` (sim.model.ops), the TP degree, sequence parallelism and the recipe's ``Fp8Casts`` (weight
casts per micro-batch, current scaling). Out: the cast/transpose (and amax-scan) ``Op`` records TE v1.8's Linear
and LayerNormLinear run for it, each in the one pass it runs in (``Op.runs_in``), and an op list with them put
after each linear GEMM (``with_fp8_casts``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.model.ops import ROW_PARALLEL, Op


@dataclass(frozen=True)
class Fp8Casts:
    """What Transformer Engine's delayed-scaling FP8 adds around each linear GEMM (``fp8_cast_ops``).
    ``weight_casts_per_microbatch``: how often a weight is cast per micro-batch: 1/m where Megatron-LM passes
    ``is_first_microbatch`` (the cast weight and its transpose are cached for the step's other micro-batches),
    1 where every forward casts it."""

    weight_casts_per_microbatch: float = 1.0
    # Current scaling (training.fp8_recipe: current): the amax of each bf16 tensor is scanned before its cast.
    current_scaling: bool = False


# Bytes per element of Transformer Engine's cast kernels (TE v1.8, transformer_engine/pytorch/module/linear.py,
# base.py grad_output_preprocess): fp8_cast_transpose_fused reads bf16 (2) and writes the FP8 tensor (1) and its
# transpose (1); cast_to_fp8 writes no transpose; fp8_transpose reads and writes one byte each.
CAST_TRANSPOSE_BYTES = 4.0
CAST_BYTES = 3.0
TRANSPOSE_BYTES = 2.0
# Current scaling's amax scan (TE Float8CurrentScalingQuantizer: "the max-abs value ... is computed directly by
# scanning the input high-precision tensor"; torchao float8 tensor_to_amax): one more read of the bf16 tensor
# before its cast, two kernels (the reduction and the scale from it).
AMAX_SCAN_BYTES = 2.0
AMAX_SCAN_KERNELS = 2
# Linear modules whose input comes from a norm fused into the module (Megatron-LM's
# TELayerNormColumnParallelLinear: the norm kernel writes its output in FP8, layernorm_linear.py).
NORM_FUSED_LINEAR = frozenset({"qkv_proj", "mlp_up"})


def fp8_cast_ops(op: Op, tp: int, sequence_parallel: bool, casts: Fp8Casts) -> tuple[Op, ...]:
    """The cast/transpose kernels Transformer Engine runs for FP8 GEMM ``op`` (none for other ops), one pass each
    (``Op.runs_in``). Per TE v1.8's Linear and LayerNormLinear with delayed scaling:
    - input, forward: fp8_cast_transpose_fused (the transpose feeds the weight gradient); under sequence
      parallelism (tp > 1) cast_to_fp8 only and an fp8_transpose in the backward. A norm-fused module's norm writes FP8
      itself (priced as the norm's), so only its backward transpose remains.
    - weight: cast with its transpose, once per ``casts.weight_casts_per_microbatch``.
    - output gradient, input-gradient pass: fp8_cast_transpose_bgrad_fused; row-parallel under sequence
      parallelism: cast the local shard, gather, fp8_transpose the gathered tensor.
    - current scaling (``casts.current_scaling``): before each of those casts of a bf16 tensor, an amax scan
      that reads it once more (``AMAX_SCAN_BYTES``); the norm-fused input is quantized inside the norm kernel.
    Element counts are of the GEMM's (tokens, in) input and (tokens, out) output on this TP rank."""
    if not op.te_linear or op.shape is None:
        return ()
    batch, tokens, out_features, in_features = op.shape  # batch: a grouped GEMM's experts, 1 otherwise
    rows = float(batch * tokens)
    inputs, outputs = rows * in_features, rows * out_features
    ops: list[Op] = []
    if op.name in NORM_FUSED_LINEAR:
        ops.append(Op(f"{op.name}_input_transpose", 0.0, inputs * TRANSPOSE_BYTES, False, runs_in="weight_grad"))
    elif sequence_parallel and tp > 1:  # SP needs TP (Megatron-LM switches it off at tp 1)
        ops.append(Op(f"{op.name}_input_cast", 0.0, inputs * CAST_BYTES, False, runs_in="forward"))
        ops.append(Op(f"{op.name}_input_transpose", 0.0, inputs * TRANSPOSE_BYTES, False, runs_in="weight_grad"))
    else:
        ops.append(Op(f"{op.name}_input_cast", 0.0, inputs * CAST_TRANSPOSE_BYTES, False, runs_in="forward"))
    weights = float(batch * in_features) * out_features
    ops.append(Op(f"{op.name}_weight_cast", 0.0, weights * CAST_TRANSPOSE_BYTES * casts.weight_casts_per_microbatch,
                  False, runs_in="forward"))
    if op.name in ROW_PARALLEL and sequence_parallel and tp > 1:
        grad_bytes = outputs / tp * CAST_BYTES + outputs * TRANSPOSE_BYTES
    else:
        grad_bytes = outputs * CAST_TRANSPOSE_BYTES
    ops.append(Op(f"{op.name}_grad_cast", 0.0, grad_bytes, False, runs_in="input_grad"))
    if casts.current_scaling:  # the amax scans of the bf16 tensors cast above (not of the norm's fused output)
        if op.name not in NORM_FUSED_LINEAR:
            ops.append(Op(f"{op.name}_input_amax", 0.0, inputs * AMAX_SCAN_BYTES, False, runs_in="forward",
                          kernels=AMAX_SCAN_KERNELS))
        ops.append(Op(f"{op.name}_weight_amax", 0.0, weights * AMAX_SCAN_BYTES * casts.weight_casts_per_microbatch,
                      False, runs_in="forward", kernels=AMAX_SCAN_KERNELS))
        grad_elements = outputs / tp if op.name in ROW_PARALLEL and sequence_parallel and tp > 1 else outputs
        ops.append(Op(f"{op.name}_grad_amax", 0.0, grad_elements * AMAX_SCAN_BYTES, False, runs_in="input_grad",
                      kernels=AMAX_SCAN_KERNELS))
    return tuple(ops)


def with_fp8_casts(ops: tuple[Op, ...], tp: int, sequence_parallel: bool, fp8_casts: Fp8Casts | None) -> tuple[Op, ...]:
    """``ops`` with FP8's cast kernels after each linear GEMM (``fp8_cast_ops``); unchanged without FP8."""
    if fp8_casts is None:
        return ops
    return tuple(out for op in ops for out in (op, *fp8_cast_ops(op, tp, sequence_parallel, fp8_casts)))

"""One kernel of a forward pass, the ``Op`` record the cost models price, and its constructors.

In: a kernel's name and shape: a GEMM's (batch, m, n, k) and element size, an element-wise kernel's elements,
reads and writes. Out: ``Op`` records (FLOPs, bytes moved through HBM, launches, the share of FLOPs executed):
plain GEMMs, Transformer Engine linears and grouped linears (the GEMMs FP8 runs in FP8), fused element-wise
kernels, and the unfused ones of a PyTorch eager Llama at their measured traffic (RMSNorm, rotary embedding).
The name sets by which tensor parallelism picks a layer's linears out (``COLUMN_PARALLEL``, ``ROW_PARALLEL``)
are here too. The ops of each part of the model are built beside: ``sim.model.attention_ops``,
``sim.model.mlp_ops``, ``sim.model.moe_ops``, ``sim.model.layer_ops``, ``sim.model.vocab_ops``; FP8's cast
kernels in ``sim.model.fp8_casts``. Backward phases are derived from these by ``sim.costs.models.phase_scale``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Op:
    """One kernel of a forward pass on one TP rank: FLOPs (GEMMs) and bytes moved through HBM. A GEMM with
    weights has two backward GEMMs, one for the input gradient (B) and one for the weight gradient (W); ops
    without weights (attention core, element-wise) have only the input-gradient part, about twice the
    forward (Qi et al. ICLR 2024 Table 1). ``runs_in``: a kernel that runs once in one pass only (FP8's
    cast/transpose kernels: the forward's input cast, the backward's output-gradient cast, the weight-gradient
    pass's input transpose), priced there and nowhere else (sim.costs.models.phase_scale). ``te_linear``: a
    Transformer Engine linear module's GEMM, the GEMMs fp8_autocast runs in FP8."""

    name: str
    flops: float
    bytes: float
    matmul: bool
    has_weights: bool = False
    shape: tuple[int, int, int, int] | None = None  # GEMMs: (batch, m, n, k), for calibration
    runs_in: Literal["forward", "input_grad", "weight_grad"] | None = None
    te_linear: bool = False
    kernels: int = 1  # kernel launches the op's forward issues (an unfused eager op is several; see below)
    # The share of ``flops`` the kernel executes: causal flash attention skips the tiles above the diagonal
    # (sim.model.flash_tiles.causal_fraction), a sliding window those outside its band. ``flops`` keeps
    # Megatron's full-matrix count, the unit of the share; ``executed_flops`` is what the kernel runs.
    executed: float = 1.0
    # False for a frozen weight (LoRA's base model, frozen layers: sim.model.peft): no weight-gradient GEMM.
    trainable: bool = True
    # Flash attention: the q/k head dim its kernel runs at (sim.costs.head_dim prices a d other than the profile
    # curve's 128); 0 for every other op.
    head_dim: int = 0

    @property
    def executed_flops(self) -> float:
        """The FLOPs the kernel runs (``flops`` x ``executed``; causal flash attention: about half): the one
        number both its time is priced on (sim.costs.models.RooflineCosts.kernel_time) and the trace counts for
        HFU (sim.costs.models.Work.flops). Before, the trace counted ``flops``, so at 509,712 causal tokens the
        attention tasks ran at 110% of the H100's peak and HFU was 1.00008 (tests/test_executed_flops.py)."""
        return self.flops * self.executed


# The column-parallel GEMM of each block (Megatron's ColumnParallelLinear): the one whose input gradient is
# all-reduced (reduce-scattered with SP) across the TP group in the backward.
# MLA's column-parallel GEMMs are its up projections (q_proj without a q latent); a MoE layer's shared expert's up
# projection is the MoE block's.
COLUMN_PARALLEL = frozenset({"qkv_proj", "mlp_up", "q_proj", "q_up_proj", "kv_up_proj", "shared_expert_up"})
# Row-parallel linears (TERowParallelLinear): their output gradient is gathered over TP with sequence parallelism.
ROW_PARALLEL = frozenset({"out_proj", "mlp_down"})


def gemm(name: str, m: float, n: float, k: float, elem: int, batch: float = 1, weights: bool = True) -> Op:
    """``batch`` GEMMs of (m x k) @ (k x n): 2bmnk FLOPs, both inputs read and the output written once."""
    return Op(name, 2.0 * batch * m * n * k, float(elem * batch * (m * k + k * n + m * n)), True, weights,
              (round(batch), round(m), round(n), round(k)))


def linear(name: str, m: float, n: float, k: float, elem: int) -> Op:
    """A transformer layer's linear GEMM: Megatron-LM builds it from Transformer Engine's modules
    (TELayerNormColumnParallelLinear, TERowParallelLinear: gpt_layer_specs.py), so fp8_autocast runs it in FP8."""
    op = gemm(name, m, n, k, elem)
    return Op(op.name, op.flops, op.bytes, True, True, op.shape, te_linear=True)


def grouped_linear(name: str, experts: int, m: float, n: float, k: float, elem: int) -> Op:
    """A grouped GEMM of ``experts`` equal (m, n, k) problems (Megatron-Core TEGroupedLinear: one kernel for the
    rank's local experts, each with its own weights, run in FP8 under fp8_autocast like any TE linear)."""
    op = gemm(name, m, n, k, elem, batch=experts)
    return Op(op.name, op.flops, op.bytes, True, True, op.shape, te_linear=True)


def elementwise(name: str, elements: float, elem: int, reads: int, writes: int, masks: int = 0,
                kernels: int = 1) -> Op:
    """A memory-bound kernel over ``elements`` of ``elem`` bytes: ``reads`` + ``writes`` tensors moved through HBM,
    ``masks`` one-byte masks, no FLOPs counted."""
    # Dropout masks are one byte per element (Korthikanti et al. Table 2 accounting).
    return Op(name, 0.0, float(elements * (elem * (reads + writes) + masks)), False, kernels=kernels)


# Unfused element-wise kernels of a PyTorch eager Llama (IBM's foundation-model-stack and Hugging Face
# transformers' LlamaRMSNorm; no torch.compile). Bytes per element of the normalized tensor, 16-bit in and out, as
# the model's memory-bound time needs them: 52, measured. The kernels' ideal traffic is 36 (cast to fp32 2+4, pow
# 4+4, mean 4, multiply by rsqrt 4+4, cast back 4+2, multiply by weight 2+2), but an H100 ran LlamaRMSNorm on
# 8,192 x 4,096 bf16 in 522 us forward and 1,731 us forward + backward (kernel time, 2026-11-26,
# sim/data/reference/gpu_eager_measurements.csv): at the H100 preset's 3.0 TB/s achieved bandwidth and the model's
# backward of twice the forward, 1,731 us / 3 per pass is 52 bytes per element. Not all bandwidth: an H200 (43%
# more) ran it in 1,383 us, 12% above the 52 bytes' price there (tests/test_eager_kernels.py).
EAGER_RMSNORM_BYTES = 52.0
# Rotary embedding on q and k in fp32 (FMS RotaryEmbedding.adjusted_qk): cast up (2+4), multiply by the 2x2
# rotation (4 read, 8 written), sum over the pair (8+4), cast back (4+2); per element of q and of k. (Hugging
# Face's bf16 apply_rotary_pos_emb moves less: an H100 ran it on Llama 3 8B's q and k at 8,192 tokens in 1,146 us
# forward + backward, 27 bytes per element's price; the FMS count stays, unmeasured.)
EAGER_ROPE_BYTES = 36.0
# Kernel launches of those eager ops (what a launch floor counts): the RMSNorm's six kernels above plus the
# eps add and rsqrt on the per-token mean; the rotary embedding's four kernels, once for q and once for k.
EAGER_RMSNORM_KERNELS = 8
EAGER_ROPE_KERNELS = 8
# Eager SwiGLU: silu(gate), then the product with up (two kernels; Megatron fuses them into one).
EAGER_SWIGLU_KERNELS = 2


def eager_norm(name: str, elements: float, elem: int, reads: int, writes: int) -> Op:
    """Eager PyTorch's RMSNorm over ``elements`` (``EAGER_RMSNORM_BYTES`` per 16-bit element, in eight kernels);
    ``reads`` and ``writes`` as ``elementwise``'s, so either builds a norm."""
    return Op(name, 0.0, float(elements * EAGER_RMSNORM_BYTES * elem / 2), False, kernels=EAGER_RMSNORM_KERNELS)


def eager_rope(elements: float) -> Op:
    """Eager rotary embedding over ``elements`` of q and k (``EAGER_ROPE_BYTES`` each, in eight kernels)."""
    return Op("rotary_embedding", 0.0, float(elements * EAGER_ROPE_BYTES), False, kernels=EAGER_ROPE_KERNELS)


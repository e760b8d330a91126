"""The kernels of one transformer layer's forward pass on one TP rank, which the cost models price.

In: a ``ModelSpec`` (sim.model.transformer), the micro-batch, sequence length, TP split, dtype size and the
kernel options (flash attention, Megatron's fused kernels or eager PyTorch, FP8's cast kernels, causal
attention). Out: ``Op`` tuples: GEMMs with FLOPs and bytes, memory-bound element-wise kernels with bytes, their
launch counts and the share of their FLOPs they execute; for the layer's two blocks (``layer_forward_ops``: the
``attention_forward_ops`` of MHA/GQA or multi-head latent attention, and a dense layer's
``dense_mlp_forward_ops``), a MoE layer's MLP (``moe_forward_ops``: router, shared expert, grouped expert GEMMs,
combine), the embedding and the head. Backward phases are derived from these by
``sim.costs.models.phase_scale``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sim.model.transformer import ModelSpec

# --------------------------------------------------------------------------------------- per-op forward work


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
    # (causal_fraction), a sliding window those outside its band. ``flops`` keeps Megatron's full-matrix count,
    # the unit of the share; ``executed_flops`` is what the kernel runs.
    executed: float = 1.0
    # False for a frozen weight (LoRA's base model, frozen layers: sim.model.peft): no weight-gradient GEMM.
    trainable: bool = True

    @property
    def executed_flops(self) -> float:
        """The FLOPs the kernel runs (``flops`` x ``executed``; causal flash attention: about half): the one
        number both its time is priced on (sim.costs.models.RooflineCosts.kernel_time) and the trace counts for
        HFU (sim.costs.models.Work.flops). Before, the trace counted ``flops``, so at 509,712 causal tokens the
        attention tasks ran at 110% of the H100's peak and HFU was 1.00008 (tests/test_executed_flops.py)."""
        return self.flops * self.executed


# The fused attention kernel's op name (priced on an attention curve where the profile has one: sim.costs.models).
FLASH_ATTENTION = "flash_attention"
# The attention core: what selective recomputation recomputes (Korthikanti et al. 2022 Sec. 5).
ATTENTION_CORE = frozenset({"attention_scores", "softmax_dropout", "attention_values", FLASH_ATTENTION})
# What each of Megatron-Core's --recompute-modules replays in the backward, by op name (transformer_config.py
# recompute_modules; transformer_layer.py, multi_latent_attention.py, moe/experts.py, moe/shared_experts.py).
# ``moe`` (the whole MoE layer under tensor_parallel.checkpoint, moe_layer.py) replays every op of the MoE part and
# its dispatch and combine: the emitters run its forward again rather than a list of ops.
RECOMPUTE_OPS: dict[str, frozenset[str]] = {
    "core_attn": ATTENTION_CORE,
    "layernorm": frozenset({"input_norm", "post_attention_norm"}),  # input_layernorm, pre_mlp_layernorm
    "mla_up_proj": frozenset({"q_proj", "q_up_proj", "kv_up_proj", "rotary_embedding"}),  # and RoPE
    "mlp": frozenset({"mlp_up", "mlp_activation", "mlp_down"}),  # the dense MLP module (its norm is outside)
    "moe_act": frozenset({"experts_activation"}),
    "shared_experts": frozenset({"shared_expert_up", "shared_expert_activation", "shared_expert_down"}),
    "moe": frozenset(),
}
# The column-parallel GEMM of each block (Megatron's ColumnParallelLinear): the one whose input gradient is
# all-reduced (reduce-scattered with SP) across the TP group in the backward.
# MLA's column-parallel GEMMs are its up projections (q_proj without a q latent); a MoE layer's shared expert's up
# projection is the MoE block's.
COLUMN_PARALLEL = frozenset({"qkv_proj", "mlp_up", "q_proj", "q_up_proj", "kv_up_proj", "shared_expert_up"})


def _gemm(name: str, m: float, n: float, k: float, elem: int, batch: float = 1, weights: bool = True) -> Op:
    return Op(name, 2.0 * batch * m * n * k, float(elem * batch * (m * k + k * n + m * n)), True, weights,
              (round(batch), round(m), round(n), round(k)))


def _linear(name: str, m: float, n: float, k: float, elem: int) -> Op:
    """A transformer layer's linear GEMM: Megatron-LM builds it from Transformer Engine's modules
    (TELayerNormColumnParallelLinear, TERowParallelLinear: gpt_layer_specs.py), so fp8_autocast runs it in FP8."""
    gemm = _gemm(name, m, n, k, elem)
    return Op(gemm.name, gemm.flops, gemm.bytes, True, True, gemm.shape, te_linear=True)


def _grouped_linear(name: str, experts: int, m: float, n: float, k: float, elem: int) -> Op:
    """A grouped GEMM of ``experts`` equal (m, n, k) problems (Megatron-Core TEGroupedLinear: one kernel for the
    rank's local experts, each with its own weights, run in FP8 under fp8_autocast like any TE linear)."""
    gemm = _gemm(name, m, n, k, elem, batch=experts)
    return Op(gemm.name, gemm.flops, gemm.bytes, True, True, gemm.shape, te_linear=True)


def _elementwise(name: str, elements: float, elem: int, reads: int, writes: int, masks: int = 0,
                 kernels: int = 1) -> Op:
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


def _eager_norm(name: str, elements: float, elem: int, reads: int, writes: int) -> Op:
    return Op(name, 0.0, float(elements * EAGER_RMSNORM_BYTES * elem / 2), False, kernels=EAGER_RMSNORM_KERNELS)


def _eager_rope(elements: float) -> Op:
    return Op("rotary_embedding", 0.0, float(elements * EAGER_ROPE_BYTES), False, kernels=EAGER_ROPE_KERNELS)


# FlashAttention-2's tile along the key/value sequence (Dao 2023, Sec. 3.1: block sizes 64 or 128 by head
# dimension; 128 for the head dimension 128 of the presets here).
FLASH_TILE = 128


def causal_fraction(seq_len: int, tile: int = FLASH_TILE) -> float:
    """The share of the s x s score tiles a causal flash-attention kernel computes: of n = ceil(s / tile) tiles per
    row of tiles, the n(n+1)/2 on and below the diagonal (FlashAttention-2, Dao 2023, Sec. 3.1.1: blocks whose
    column indices all exceed their row indices are skipped, "about half of the blocks" at long sequences; the
    diagonal blocks are computed whole and masked). 2048 tokens: 17/32; 8192: 65/128."""
    n = -(-seq_len // tile)
    return (n + 1) / (2 * n)


def window_fraction(seq_len: int, window: int, tile: int = FLASH_TILE) -> float:
    """The share of the s x s score tiles a sliding-window flash-attention kernel computes: query tile i needs the
    key tiles from the one holding token i*tile - window + 1 to its own (FlashAttention-2's window_size, the band
    below the diagonal; tiles wholly outside it are skipped, those it crosses computed and masked). GPT-OSS's
    128-token window at 4096 tokens: (1 + 2 x 31) / 32^2."""
    n = -(-seq_len // tile)
    return sum(i - max(0, (i * tile - window + 1) // tile) + 1 for i in range(n)) / (n * n)


def _executed_share(spec: ModelSpec, seq_len: int, causal: bool) -> float:
    """The share of the full-matrix attention FLOPs the flash kernel executes, averaged over the model's layers
    (the ops are one layer's, the same for every layer): full-attention layers ``causal_fraction`` (or all of it),
    sliding-window layers (``ModelSpec.window_layers``) ``window_fraction``."""
    full = causal_fraction(seq_len) if causal else 1.0
    if spec.window_size is None:
        return full
    windowed = sum(spec.window_layers)
    band = window_fraction(seq_len, spec.window_size)
    return ((spec.num_layers - windowed) * full + windowed * band) / spec.num_layers


def _with_casts(ops: tuple[Op, ...], tp: int, sequence_parallel: bool, fp8_casts: Fp8Casts | None) -> tuple[Op, ...]:
    """``ops`` with FP8's cast kernels after each linear GEMM (``fp8_cast_ops``); unchanged without FP8."""
    if fp8_casts is None:
        return ops
    return tuple(out for op in ops for out in (op, *fp8_cast_ops(op, tp, sequence_parallel, fp8_casts)))


def _mla_projections(spec: ModelSpec, tokens: float, replicated_tokens: float, tp: int, elem_bytes: int,
                     norm: Callable[..., Op]) -> list[Op]:
    """Multi-head latent attention's projections on one TP rank (Megatron-Core multi_latent_attention.py,
    MLASelfAttention.get_query_key_value_tensors): the q and kv down projections are duplicated linears run on the
    rank's own tokens (``replicated_tokens``: b*s/tp under sequence parallelism, whose all-gather then carries the
    latents), their norms, and the column-parallel up projections over all b*s tokens and heads/tp."""
    h, heads = spec.hidden_size, spec.num_attention_heads / tp
    kv_lora = spec.kv_lora_rank or 0
    nope, rope, v = spec.qk_head_dim or 0, spec.qk_pos_emb_head_dim or 0, spec.v_head_dim or 0
    ops: list[Op] = []
    if spec.q_lora_rank:
        ops += [_linear("q_down_proj", replicated_tokens, spec.q_lora_rank, h, elem_bytes),
                norm("q_norm", replicated_tokens * spec.q_lora_rank, elem_bytes, reads=1, writes=1),
                _linear("q_up_proj", tokens, heads * (nope + rope), spec.q_lora_rank, elem_bytes)]
    else:
        ops.append(_linear("q_proj", tokens, heads * (nope + rope), h, elem_bytes))
    ops += [_linear("kv_down_proj", replicated_tokens, kv_lora + rope, h, elem_bytes),
            norm("kv_norm", replicated_tokens * kv_lora, elem_bytes, reads=1, writes=1),
            _linear("kv_up_proj", tokens, heads * (nope + v), kv_lora, elem_bytes)]
    return ops


def attention_forward_ops(
    spec: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    elem_bytes: int,
    flash_attention: bool,
    fused_kernels: bool = True,
    fp8_casts: Fp8Casts | None = None,
    causal: bool = False,
    fused_norm_rope: bool | None = None,
    kv_seq_len: int | None = None,
    executed: float | None = None,
) -> tuple[Op, ...]:
    """Forward kernels of one layer's attention block on one TP rank (``layer_forward_ops``'s ``attention``):
    input norm, QKV projection (MLA: its down and up projections), the attention core, output projection,
    dropout + residual. Arguments as ``layer_forward_ops``; under context parallelism (sim.parallel.context)
    ``seq_len`` is the rank's s/cp tokens, ``kv_seq_len`` the keys each query sees (all s; default ``seq_len``)
    and ``executed`` the share of the flash kernel's full-matrix FLOPs it runs (default: ``causal_fraction``)."""
    b, s, h = micro_batch, seq_len, spec.hidden_size
    kv_s = kv_seq_len or s
    tokens = b * s
    heads = spec.num_attention_heads / tp
    kv_local = spec.kv_dim / tp
    q_local = spec.q_dim / tp
    replicated_tokens = tokens / tp if sequence_parallel else tokens
    hidden_elems = replicated_tokens * h
    if spec.multi_latent_attention:
        qk_dim = (spec.qk_head_dim or 0) + (spec.qk_pos_emb_head_dim or 0)
        v_dim = spec.v_head_dim or 0
    else:
        qk_dim = v_dim = spec.head_dim

    # Eager PyTorch's LayerNorm is one fused ATen kernel (aten/src/ATen/native/cuda/layer_norm_kernel.cu: one
    # read, one write); only RMSNorm written in Python (HF/FMS LlamaRMSNorm) runs as the eight kernels above.
    fused_norm = fused_kernels if fused_norm_rope is None else fused_norm_rope
    norm = _eager_norm if not fused_norm and spec.norm == "rmsnorm" else _elementwise
    attention: list[Op] = [norm("input_norm", hidden_elems, elem_bytes, reads=1, writes=1)]
    if spec.multi_latent_attention:
        attention += _mla_projections(spec, tokens, replicated_tokens, tp, elem_bytes, norm)
    else:
        attention.append(_linear("qkv_proj", tokens, q_local + 2 * kv_local, h, elem_bytes))
    if not fused_norm and spec.position_embedding == "rope":
        attention.append(_eager_rope(tokens * (q_local + kv_local)))
    if flash_attention:
        # Fused kernel: reads Q, K, V and writes O once; the s x s scores never reach HBM (Dao et al. 2022).
        # Its FLOPs are Megatron's full-matrix count (MFU, HFU); its time is that of the tiles it executes.
        if spec.multi_latent_attention:  # q and k of d_nope + d_rope, v and o of d_v per head
            flash_flops = 2.0 * b * heads * s * s * (qk_dim + v_dim)
            flash_bytes = float(elem_bytes * tokens * heads * (2 * qk_dim + 2 * v_dim))
        else:  # q and o of the rank's tokens, k and v of the keys they see
            flash_flops = 2.0 * 2 * b * heads * s * kv_s * spec.head_dim
            flash_bytes = float(elem_bytes * b * (2 * q_local * s + 2 * kv_local * kv_s))
        share = _executed_share(spec, s, causal) if executed is None else executed
        attention.append(Op(FLASH_ATTENTION, flash_flops, flash_bytes, True, executed=share))
    else:
        score_elems = b * heads * s * s
        attention += [
            _gemm("attention_scores", s, s, qk_dim, elem_bytes, batch=b * heads, weights=False),
            _elementwise("softmax_dropout", score_elems, elem_bytes, reads=1, writes=2, masks=1),
            _gemm("attention_values", s, v_dim, s, elem_bytes, batch=b * heads, weights=False),
        ]
    out_local = heads * v_dim if spec.multi_latent_attention else q_local
    if not fused_kernels:  # (b, heads, s, d) attention output copied back to (b, s, h) before the projection
        attention.append(_elementwise("attention_transpose", tokens * out_local, elem_bytes, reads=1, writes=1))
    attention += [
        _linear("out_proj", tokens, h, out_local, elem_bytes),
        _elementwise("attn_dropout_residual", hidden_elems, elem_bytes, reads=2, writes=1,
                     masks=1 if fused_kernels else 0),
    ]
    return _with_casts(tuple(attention), tp, sequence_parallel, fp8_casts)


def _mlp_activation(spec: ModelSpec, name: str, elements: float, elem_bytes: int, fused_kernels: bool) -> Op:
    """The MLP's activation over ``elements`` (tokens x local FFN width): bias-GeLU, SwiGLU or squared ReLU."""
    activation_reads = 2 if spec.gated_mlp else 1
    activation_kernels = 1
    if not fused_kernels and spec.gated_mlp:  # act(gate) is written out, then multiplied by up
        activation_reads, activation_writes, activation_kernels = 3, 2, EAGER_SWIGLU_KERNELS
    elif spec.mlp == "squared_relu":
        # Megatron-LM's squared_relu is torch.pow(F.relu(x), 2) (megatron/core/activations.py), never fused:
        # two element-wise kernels, each reading and writing the (tokens, ffn) tensor.
        activation_reads, activation_writes, activation_kernels = 2, 2, 2
    else:
        activation_writes = 1
    return _elementwise(name, elements, elem_bytes, reads=activation_reads, writes=activation_writes,
                        kernels=activation_kernels)


def dense_mlp_forward_ops(
    spec: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    elem_bytes: int,
    flash_attention: bool,
    fused_kernels: bool = True,
    fp8_casts: Fp8Casts | None = None,
    causal: bool = False,
    fused_norm_rope: bool | None = None,
) -> tuple[Op, ...]:
    """Forward kernels of one dense layer's MLP block on one TP rank (``layer_forward_ops``'s ``mlp``):
    post-attention norm, up projection (gate and up under SwiGLU), activation, down projection, dropout +
    residual. Arguments as ``layer_forward_ops`` (``flash_attention`` and ``causal`` do not apply)."""
    tokens = micro_batch * seq_len
    h = spec.hidden_size
    ffn_local = spec.ffn / tp
    replicated_tokens = tokens / tp if sequence_parallel else tokens
    hidden_elems = replicated_tokens * h
    fused_norm = fused_kernels if fused_norm_rope is None else fused_norm_rope
    norm = _eager_norm if not fused_norm and spec.norm == "rmsnorm" else _elementwise
    up_width = (2 if spec.gated_mlp else 1) * ffn_local
    mlp = (
        norm("post_attention_norm", hidden_elems, elem_bytes, reads=1, writes=1),
        _linear("mlp_up", tokens, up_width, h, elem_bytes),
        _mlp_activation(spec, "mlp_activation", tokens * ffn_local, elem_bytes, fused_kernels),
        _linear("mlp_down", tokens, h, ffn_local, elem_bytes),
        _elementwise("mlp_dropout_residual", hidden_elems, elem_bytes, reads=2, writes=1,
                     masks=1 if fused_kernels else 0),
    )
    return _with_casts(mlp, tp, sequence_parallel, fp8_casts)


def layer_forward_ops(
    spec: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    elem_bytes: int,
    flash_attention: bool,
    fused_kernels: bool = True,
    fp8_casts: Fp8Casts | None = None,
    causal: bool = False,
    fused_norm_rope: bool | None = None,
) -> dict[str, tuple[Op, ...]]:
    """Forward kernels of one layer on one TP rank, as two blocks (``attention``, ``mlp``) separated by the
    Megatron tensor-parallel collectives. Norm/dropout/residual work is divided by tp only with sequence
    parallelism (without it every TP rank repeats it). ``fused_kernels``: Megatron-LM's fused norm, bias-
    activation and dropout-add kernels (one read and one write per tensor); without it, the unfused element-wise
    kernels of a PyTorch eager Llama (``EAGER_RMSNORM_BYTES``, ``EAGER_ROPE_BYTES`` above). ``fp8_casts``:
    FP8 training's cast/transpose kernels around each linear GEMM (``fp8_cast_ops``); None: none. ``causal``: flash
    attention skips the score tiles above the diagonal (``causal_fraction``); the unfused path computes the full
    s x s matrix and masks it, as Megatron-LM's fused masked softmax does. ``fused_norm_rope``: the RMSNorm and
    rotary kernels fused (one read, one write) or eager whatever ``fused_kernels`` says (None: as it says), for
    eager modelling code calling flash-attn's fused kernels. A MoE layer's MLP is ``moe_forward_ops``."""
    args = (spec, micro_batch, seq_len, tp, sequence_parallel, elem_bytes, flash_attention, fused_kernels,
            fp8_casts, causal, fused_norm_rope)
    return {"attention": attention_forward_ops(*args), "mlp": dense_mlp_forward_ops(*args)}


def moe_forward_ops(
    spec: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    elem_bytes: int,
    etp: int,
    local_experts: int,
    routed_tokens: float,
    fp8_casts: Fp8Casts | None = None,
) -> dict[str, tuple[Op, ...]]:
    """Forward kernels of one MoE layer's MLP on one rank, in four blocks, between which the Plan puts the
    token dispatch and combine (Megatron-Core moe_layer.py MoELayer.forward, token_dispatcher.py):

    - ``moe_router``: post-attention norm; the router GEMM (rank's tokens x E x h: b*s/tp under sequence
      parallelism, all b*s without; replicated weights, not a Transformer Engine module: router.py's
      torch linear, so no FP8); top-k over the scores; the permute (a copy of the rank's tokens x topk x h into
      expert order, moe_utils.permute).
    - ``moe_shared``: the shared expert, a dense MLP of moe_shared_expert_intermediate_size sharded by tp over
      all b*s tokens (empty without one).
    - ``moe_experts``: grouped GEMMs (TEGroupedLinear), one Op per projection with batch = ``local_experts``,
      m = ``routed_tokens`` / ``local_experts`` (the mean tokens per local expert), n = the expert's FFN width
      (x2 for SwiGLU's gate and up) / ``etp``, k = hidden; the activation; the down projection.
    - ``moe_combine``: the unpermute, the top-k weighted sum of each token's expert outputs
      (moe_utils.unpermute: reads tokens x topk x h, writes tokens x h), and the residual add.

    ``routed_tokens``: token-expert pairs this rank's local experts compute for one micro-batch (the Plan
    decides it, imbalance included; uniform routing over ep ranks: b*s x topk / (tp when SP) per rank, since
    each of the ep x etp ranks' experts sees its share). Gives FLOPs of the router, the routed experts and the
    shared expert (``sim.model.flops.moe_mlp_forward_flops`` summed over the ranks)."""
    tokens = micro_batch * seq_len
    h, experts, topk = spec.hidden_size, spec.num_moe_experts or 0, spec.moe_router_topk
    replicated_tokens = tokens / tp if sequence_parallel else tokens
    hidden_elems = replicated_tokens * h
    router = (
        _elementwise("post_attention_norm", hidden_elems, elem_bytes, reads=1, writes=1),
        _gemm("router", replicated_tokens, experts, h, elem_bytes),
        # Softmax (or sigmoid) over the E scores and top-k selection: reads the logits, writes the scores and
        # the top-k probabilities and indices.
        _elementwise("router_topk", replicated_tokens * experts, elem_bytes, reads=1, writes=1),
        _elementwise("moe_permute", replicated_tokens * topk * h, elem_bytes, reads=1, writes=1),
    )
    shared_width = spec.moe_shared_expert_intermediate_size or 0
    shared: tuple[Op, ...] = ()
    if shared_width:
        shared_local = shared_width / tp
        shared = (
            _linear("shared_expert_up", tokens, (2 if spec.gated_mlp else 1) * shared_local, h, elem_bytes),
            _mlp_activation(spec, "shared_expert_activation", tokens * shared_local, elem_bytes, True),
            _linear("shared_expert_down", tokens, h, shared_local, elem_bytes),
        )
    ffn_local = spec.moe_ffn / etp
    per_expert = routed_tokens / local_experts
    up_width = (2 if spec.gated_mlp else 1) * ffn_local
    grouped = (
        _grouped_linear("experts_fc1", local_experts, per_expert, up_width, h, elem_bytes),
        _mlp_activation(spec, "experts_activation", routed_tokens * ffn_local, elem_bytes, True),
        _grouped_linear("experts_fc2", local_experts, per_expert, h, ffn_local, elem_bytes),
    )
    combine = (
        _elementwise("moe_unpermute", hidden_elems, elem_bytes, reads=topk, writes=1),
        _elementwise("mlp_dropout_residual", hidden_elems, elem_bytes, reads=2, writes=1, masks=1),
    )
    return {
        "moe_router": router,
        "moe_shared": _with_casts(shared, tp, sequence_parallel, fp8_casts),
        "moe_experts": _with_casts(grouped, etp, False, fp8_casts),
        "moe_combine": combine,
    }


# --------------------------------------------------------------------------------------- FP8 cast kernels


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
# Row-parallel linears (TERowParallelLinear): their output gradient is gathered over TP with sequence parallelism.
ROW_PARALLEL = frozenset({"out_proj", "mlp_down"})


def fp8_cast_ops(op: Op, tp: int, sequence_parallel: bool, casts: Fp8Casts) -> tuple[Op, ...]:
    """The cast/transpose kernels Transformer Engine runs for FP8 GEMM ``op`` (none for other ops), one pass each
    (``Op.runs_in``). Per TE v1.8's Linear and LayerNormLinear with delayed scaling:
    - input, forward: fp8_cast_transpose_fused (the transpose feeds the weight gradient); under sequence
      parallelism cast_to_fp8 only and an fp8_transpose in the backward. A norm-fused module's norm writes FP8
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
    elif sequence_parallel:
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


def embedding_forward_ops(spec: ModelSpec, micro_batch: int, seq_len: int, elem_bytes: int) -> tuple[Op, ...]:
    tokens = micro_batch * seq_len
    return (_elementwise("embedding_lookup", tokens * spec.hidden_size, elem_bytes, reads=1, writes=1),)


def head_forward_ops(spec: ModelSpec, micro_batch: int, seq_len: int, tp: int, elem_bytes: int,
                     cross_entropy: str = "fused") -> tuple[Op, ...]:
    """Final norm, vocab-parallel logits GEMM and cross-entropy (fp32 logits) on one TP rank. The logits GEMM is
    not a Transformer Engine module (Megatron-LM's output_layer is tensor_parallel.ColumnParallelLinear,
    gpt_model.py) and runs outside the decoder's fp8_autocast (transformer_block.py), so it stays bf16 under
    FP8 training (``te_linear`` false). ``cross_entropy`` "hf" (``training.cross_entropy``): Hugging Face's loss
    first materialises the logits in fp32 (read 16-bit, write fp32; in the backward the gradient is cast back and
    copied into the unshifted shape, the weightless op's 2x), then log_softmax and nll_loss as the fused kernel."""
    tokens = micro_batch * seq_len
    vocab_local = spec.vocab_size / tp
    logits = tokens * vocab_local
    upcast = (_elementwise("logits_upcast", logits, 2, reads=1, writes=2),) if cross_entropy == "hf" else ()
    return (
        _elementwise("final_norm", tokens * spec.hidden_size, elem_bytes, reads=1, writes=1),
        _gemm("logits", tokens, vocab_local, spec.hidden_size, elem_bytes),
        *upcast,
        _elementwise("cross_entropy", tokens * vocab_local, 4, reads=2, writes=1),
    )

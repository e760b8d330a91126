"""Mixture-of-experts and multi-head latent attention: parameter counts against the model cards, written out by
hand term by term from each model's config.json (tests/data/hf_configs/), and the MoE FLOP counts.

Card figures are rounded to their last digit; each test asserts the exact hand sum and the card figure within
half a unit of its last digit (or, where the card truncates, below the next unit), with the convention the
publisher uses for "active" said at each test."""

from dataclasses import replace

import pytest

from sim.model.attention_ops import attention_forward_ops
from sim.model.flops import layer_forward_flops, logits_forward_flops, model_flops_per_step, moe_mlp_forward_flops
from sim.model.fp8_casts import Fp8Casts
from sim.model.layer_ops import layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.memory import activation_bytes_per_layer
from sim.model.mlp_ops import dense_mlp_forward_ops
from sim.model.moe_ops import moe_forward_ops
from sim.model.params import active_params, embedding_params, layer_params, total_params
from sim.model.presets import MODEL_PRESETS

B = 1e9


def swiglu_expert(h, f):
    return 3 * h * f  # gate, up, down


def gqa_attention(h, heads, kv_heads, head_dim):
    q, kv = heads * head_dim, kv_heads * head_dim
    return h * q + 2 * h * kv + q * h  # q, k, v, o (no biases)


# ------------------------------------------------------------------------------------------ Mixtral 8x7B / 8x22B


def mixtral_by_hand(layers, h, heads, kv_heads, f, vocab, experts=8, topk=2):
    attention = gqa_attention(h, heads, kv_heads, h // heads)
    router, norms = experts * h, 2 * h
    per_layer_total = attention + experts * swiglu_expert(h, f) + router + norms
    per_layer_active = attention + topk * swiglu_expert(h, f) + router + norms
    outside = vocab * h + h + vocab * h  # embedding, final norm, untied LM head
    return layers * per_layer_total + outside, layers * per_layer_active + outside


def test_mixtral_8x7b_is_46_7b_total_12_9b_active():
    spec = MODEL_PRESETS["mixtral-8x7b"]
    total, active = mixtral_by_hand(32, 4096, 32, 8, 14336, 32000)
    assert (total_params(spec), active_params(spec)) == (total, active) == (46_702_792_704, 12_879_925_248)
    # Mistral's announcement: 46.7B total, 12.9B per token (embedding and head counted).
    assert total / B == pytest.approx(46.7, abs=0.05)
    assert active / B == pytest.approx(12.9, abs=0.05)


def test_mixtral_8x22b_is_141b_total_39b_active():
    spec = MODEL_PRESETS["mixtral-8x22b"]
    total, active = mixtral_by_hand(56, 6144, 48, 8, 16384, 32000)
    assert (total_params(spec), active_params(spec)) == (total, active)
    assert total / B == pytest.approx(141, abs=0.5)  # Mistral: 141B total, 39B active
    assert active / B == pytest.approx(39, abs=0.5)


# ------------------------------------------------------------------------------------------------------- Qwen3


def qwen3_by_hand(layers, h, heads, kv_heads, head_dim, moe_f, vocab, experts=128, topk=8):
    attention = gqa_attention(h, heads, kv_heads, head_dim) + 2 * head_dim  # q_norm, k_norm of head_dim
    router, norms = experts * h, 2 * h
    per_layer_total = attention + experts * swiglu_expert(h, moe_f) + router + norms
    per_layer_active = attention + topk * swiglu_expert(h, moe_f) + router + norms
    outside = 2 * vocab * h + h
    return layers * per_layer_total + outside, layers * per_layer_active + outside


def test_qwen3_30b_a3b():
    spec = MODEL_PRESETS["qwen3-30b-a3b"]
    total, active = qwen3_by_hand(48, 2048, 32, 4, 128, 768, 151936)
    assert (total_params(spec), active_params(spec)) == (total, active)
    # Model card: 30.5B total, 3.3B activated, 29.9B non-embedding (both embeddings out).
    assert total / B == pytest.approx(30.5, abs=0.05)
    assert (total - 2 * 151936 * 2048) / B == pytest.approx(29.9, abs=0.05)
    assert 3.3 <= active / B < 3.4  # 3.353B with the embeddings: the card truncates


def test_qwen3_235b_a22b():
    spec = MODEL_PRESETS["qwen3-235b-a22b"]
    total, active = qwen3_by_hand(94, 4096, 64, 4, 128, 1536, 151936)
    assert (total_params(spec), active_params(spec)) == (total, active)
    assert total / B == pytest.approx(235, abs=0.5)  # model card: 235B total, 22B activated
    assert active / B == pytest.approx(22, abs=0.5)


# -------------------------------------------------------------------------------------------------- DeepSeek-V3


def deepseek_v3_attention():
    h, heads, q_lora, kv_lora, nope, rope, v = 7168, 128, 1536, 512, 128, 64, 128
    return (h * q_lora + q_lora  # q_a_proj, q_a_layernorm
            + q_lora * heads * (nope + rope)  # q_b_proj
            + h * (kv_lora + rope) + kv_lora  # kv_a_proj_with_mqa, kv_a_layernorm
            + kv_lora * heads * (nope + v)  # kv_b_proj
            + heads * v * h)  # o_proj


def test_deepseek_v3_is_671b_total_37b_active():
    spec = MODEL_PRESETS["deepseek-v3"]
    h, vocab = 7168, 129280
    attention, norms = deepseek_v3_attention(), 2 * h
    dense_layer = attention + swiglu_expert(h, 18432) + norms
    gate = 256 * h + 256  # weight and e_score_correction_bias
    moe_total = attention + 256 * swiglu_expert(h, 2048) + swiglu_expert(h, 2048) + gate + norms
    moe_active = attention + 8 * swiglu_expert(h, 2048) + swiglu_expert(h, 2048) + gate + norms
    outside = 2 * vocab * h + h
    total = 3 * dense_layer + 58 * moe_total + outside
    active = 3 * dense_layer + 58 * moe_active + outside
    assert (total_params(spec), active_params(spec)) == (total, active) == (671_026_419_200, 37_552_297_472)
    assert spec.moe_layers == (False,) * 3 + (True,) * 58 and spec.num_moe_layers == 58
    # DeepSeek-V3 report: 671B total (the 14B multi-token-prediction module aside), 37B activated. Their 37B
    # leaves out the input embedding (a lookup, no FLOPs): 36.63B; with it, 37.55B.
    assert total / B == pytest.approx(671, abs=0.5)
    assert (active - vocab * h) / B == pytest.approx(37, abs=0.5)


# ------------------------------------------------------------------------------------------------- GPT-OSS-120B


def test_gpt_oss_120b_is_116_83b_total_5_13b_active():
    spec = MODEL_PRESETS["gpt-oss-120b"]
    h, heads, kv_heads, head_dim, f, experts, vocab = 2880, 64, 8, 64, 2880, 128, 201088
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = gqa_attention(h, heads, kv_heads, head_dim) + (q + 2 * kv) + h + heads  # qkv and o biases, sinks
    expert = h * 2 * f + 2 * f + f * h + h  # gate_up_proj and its bias, down_proj and its bias
    router, norms = experts * h + experts, 2 * h  # the router is a biased linear
    per_layer_total = attention + experts * expert + router + norms
    per_layer_active = attention + 4 * expert + router + norms
    outside = 2 * vocab * h + h
    total, active = 36 * per_layer_total + outside, 36 * per_layer_active + outside
    assert (total_params(spec), active_params(spec)) == (total, active)
    # Model card (arXiv 2508.10925, Table 1): 116.83B total, 5.13B active, the unembedding counted, the
    # embedding not.
    assert total / B == pytest.approx(116.83, abs=0.005)
    assert (active - embedding_params(spec)) / B == pytest.approx(5.13, abs=0.005)


# -------------------------------------------------------------------------------------------- the layer split


def test_layer_params_split_experts_from_the_dense_part():
    spec = MODEL_PRESETS["mixtral-8x7b"]
    moe, dense = layer_params(spec, moe=True), layer_params(spec)
    h, f = 4096, 14336
    assert moe.experts == 8 * 3 * h * f
    assert moe.total == moe.sharded + moe.replicated + moe.experts
    assert moe.per_tp_rank(4) == moe.sharded / 4 + moe.replicated  # experts excluded
    assert moe.experts_per_rank(ep=8, etp=1) == 3 * h * f
    assert moe.experts_per_rank(ep=4, etp=2) == 3 * h * f
    assert moe.replicated - dense.replicated == 8 * h  # the router, on every TP rank
    assert dense.experts == 0


def test_deepseek_v3_mla_down_projections_are_replicated_over_tp():
    # Megatron-Core builds linear_q_down_proj and linear_kv_down_proj as duplicated TELinear.
    spec = MODEL_PRESETS["deepseek-v3"]
    h = 7168
    replicated = h * 1536 + 1536 + h * (512 + 64) + 512 + 2 * h
    assert layer_params(spec).replicated == replicated
    assert layer_params(spec, moe=True).replicated == replicated + 256 * h + 256


def test_dense_models_are_not_moe():
    spec = MODEL_PRESETS["llama3-8b"]
    assert not spec.is_moe and spec.num_moe_layers == 0 and spec.moe_layers == (False,) * 32
    assert active_params(spec) == total_params(spec)


def test_moe_layer_freq_int_and_pattern():
    base = MODEL_PRESETS["mixtral-8x7b"].model_dump()
    every_other = MODEL_PRESETS["mixtral-8x7b"].model_validate({**base, "num_layers": 4, "moe_layer_freq": 2})
    assert every_other.moe_layers == (True, False, True, False)
    with pytest.raises(ValueError, match="moe_layer_freq must be 4 entries of 0 or 1"):
        MODEL_PRESETS["mixtral-8x7b"].model_validate({**base, "num_layers": 4, "moe_layer_freq": (0, 1)})
    with pytest.raises(ValueError, match="moe_router_topk 9 exceeds num_moe_experts 8"):
        MODEL_PRESETS["mixtral-8x7b"].model_validate({**base, "moe_router_topk": 9})


# ------------------------------------------------------------------------------------------------------ FLOPs


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"])
def test_moe_layer_flops_are_twice_the_active_gemm_weights_per_token(name):
    """Forward GEMM FLOPs of a MoE layer = 2 x tokens x (active matrix parameters), plus the attention core
    4 b s^2 x heads x head dims (MLA: 2 b s^2 heads (d_nope + d_rope + d_v))."""
    spec = MODEL_PRESETS[name]
    b, s = 2, 4096
    layer = layer_params(spec, moe=True)
    experts = spec.num_moe_experts
    per_expert = layer.experts // experts
    active = layer.sharded + layer.replicated + spec.moe_router_topk * per_expert
    not_gemm = 2 * spec.hidden_size  # the two norms
    if spec.name == "deepseek-v3":
        not_gemm += 1536 + 512 + experts  # the latent norms and the expert bias
        core = 2 * b * s * s * 128 * (128 + 64 + 128)
    else:
        core = 4 * b * s * s * spec.q_dim
    if spec.qk_layernorm:
        not_gemm += 2 * spec.head_dim
    if spec.bias:  # GPT-OSS: biases (qkv, o, router, expert up and down) and sinks
        not_gemm += (spec.q_dim + 2 * spec.kv_dim + spec.hidden_size + experts + spec.num_attention_heads
                     + spec.moe_router_topk * (2 * spec.moe_ffn + spec.hidden_size))
    assert layer_forward_flops(spec, b, s, moe=True) == pytest.approx(2 * b * s * (active - not_gemm) + core,
                                                                      rel=1e-12)


def test_deepseek_v3_step_flops_sum_dense_and_moe_layers():
    spec = MODEL_PRESETS["deepseek-v3"]
    s, batch = 4096, 8
    per_sequence = (3 * layer_forward_flops(spec, 1, s) + 58 * layer_forward_flops(spec, 1, s, moe=True)
                    + logits_forward_flops(spec, 1, s))
    assert model_flops_per_step(spec, batch, s) == pytest.approx(3 * batch * per_sequence, rel=1e-12)
    # 6 x active non-embedding parameters per token, plus attention: the usual 6N rule, within the core's share.
    tokens = batch * s
    six_n = 6 * tokens * (active_params(spec) - embedding_params(spec))
    assert six_n < model_flops_per_step(spec, batch, s) < 1.6 * six_n


# ------------------------------------------------------------------------------------------------ kernels (ops)


def flops(ops):
    return sum(op.flops for op in ops)


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-13b", "qwen3-30b-a3b", "deepseek-v3"])
@pytest.mark.parametrize("flash", [False, True])
def test_layer_forward_ops_is_the_attention_and_dense_mlp_blocks(name, flash):
    spec = MODEL_PRESETS[name]
    shape = LayerShape(spec, 1, 2048, 2, sequence_parallel=True, elem_bytes=2, flash_attention=flash,
                       fp8_casts=Fp8Casts(0.5), causal=True)
    assert layer_forward_ops(shape) == {"attention": attention_forward_ops(shape), "mlp": dense_mlp_forward_ops(shape)}


@pytest.mark.parametrize("name", ["qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"])
@pytest.mark.parametrize("flash", [False, True])
def test_attention_ops_summed_over_tp_ranks_are_the_layer_attention_flops(name, flash):
    """With sequence parallelism every TP rank runs 1/tp of every GEMM (MLA's duplicated down projections on its
    own b*s/tp tokens), so tp x one rank's FLOPs = the attention part of the layer's model FLOPs."""
    spec = MODEL_PRESETS[name]
    b, s, tp = 2, 4096, 4
    attention = layer_forward_flops(spec, b, s, moe=True) - moe_mlp_forward_flops(spec, b * s)
    ops = attention_forward_ops(LayerShape(spec, b, s, tp, sequence_parallel=True, elem_bytes=2, flash_attention=flash))
    assert tp * flops(ops) == pytest.approx(attention, rel=1e-12)


def test_deepseek_v3_mla_projection_shapes():
    spec = MODEL_PRESETS["deepseek-v3"]
    shape = LayerShape(spec, 1, 4096, 8, sequence_parallel=True, elem_bytes=2, flash_attention=True)
    ops = {op.name: op for op in attention_forward_ops(shape)}
    tokens = 4096
    assert ops["q_down_proj"].shape == (1, tokens // 8, 1536, 7168)  # duplicated, on the rank's own tokens
    assert ops["kv_down_proj"].shape == (1, tokens // 8, 512 + 64, 7168)
    assert ops["q_up_proj"].shape == (1, tokens, 128 // 8 * (128 + 64), 1536)
    assert ops["kv_up_proj"].shape == (1, tokens, 128 // 8 * (128 + 128), 512)
    assert ops["out_proj"].shape == (1, tokens, 7168, 128 // 8 * 128)
    assert ops["flash_attention"].flops == 2 * 16 * 4096 * 4096 * (192 + 128)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3", "gpt-oss-120b"])
@pytest.mark.parametrize("tp, sp, ep, etp", [(1, False, 8, 1), (2, True, 2, 1), (2, True, 1, 2), (4, True, 4, 1)])
def test_moe_ops_summed_over_ranks_are_the_active_moe_flops(name, tp, sp, ep, etp):
    """One micro-batch of T tokens on a TP group whose ranks also form the expert group (Megatron-Core's MoE
    parallel folding, ep x etp = tp ranks; tp=1: 8 data-parallel ranks' micro-batches over 8 EP ranks). Uniform
    routing: the group's T x topk token-expert pairs (per micro-batch) split evenly over the ep ranks, each
    etp rank computing 1/etp of every pair. Summed over the ranks and divided by the micro-batches they hold,
    the FLOPs are the closed form 2T (E h + topk m h f_moe + m h f_shared), m the MLP's matrices."""
    spec = MODEL_PRESETS[name]
    b, s = 1, 4096
    tokens = b * s
    ranks = max(tp, ep * etp)
    microbatches = ranks // tp  # micro-batches the group's ranks hold at once (tp=1: one per rank)
    pairs = microbatches * tokens * spec.moe_router_topk
    routed = pairs / ep  # per rank; every etp rank of an expert sees all its pairs
    experts = spec.num_moe_experts
    shape = LayerShape(spec, b, s, tp, sequence_parallel=sp, elem_bytes=2, flash_attention=True)
    total = ranks * flops(op for block in moe_forward_ops(shape, etp, experts // ep, routed).values() for op in block)
    h, m = spec.hidden_size, spec.mlp_matrices
    closed = 2 * tokens * (experts * h + spec.moe_router_topk * m * h * spec.moe_ffn
                           + m * h * (spec.moe_shared_expert_intermediate_size or 0))
    assert total / microbatches == pytest.approx(closed, rel=1e-12)
    assert closed == pytest.approx(moe_mlp_forward_flops(spec, tokens), rel=1e-12)


def test_moe_grouped_gemm_shapes_and_block_order():
    spec = MODEL_PRESETS["deepseek-v3"]
    shape = LayerShape(spec, 1, 4096, 2, sequence_parallel=True, elem_bytes=2, flash_attention=True)
    blocks = moe_forward_ops(shape, etp=2, local_experts=32, routed_tokens=32 * 256.0)
    assert list(blocks) == ["moe_router", "moe_shared", "moe_experts", "moe_combine"]
    ops = {op.name: op for block in blocks.values() for op in block}
    assert ops["experts_fc1"].shape == (32, 256, 2 * 2048 // 2, 7168)  # (local experts, m, n, k)
    assert ops["experts_fc2"].shape == (32, 256, 7168, 2048 // 2)
    assert ops["experts_fc1"].has_weights and ops["experts_fc2"].has_weights
    assert ops["router"].shape == (1, 2048, 256, 7168)  # the rank's b*s/tp tokens under SP
    assert ops["moe_permute"].bytes == 2 * (2048 * 8 * 7168) * 2  # read and write tokens x topk x h
    assert ops["shared_expert_up"].shape == (1, 4096, 2 * 2048 // 2, 7168)
    assert [op.name for op in blocks["moe_experts"]] == ["experts_fc1", "experts_activation", "experts_fc2"]
    shape = LayerShape(MODEL_PRESETS["mixtral-8x7b"], 1, 4096, 1, sequence_parallel=False, elem_bytes=2,
                       flash_attention=True)
    mixtral = moe_forward_ops(shape, 1, 8, 8192.0)
    assert mixtral["moe_shared"] == ()


def test_fp8_casts_of_a_grouped_gemm_cover_every_expert():
    spec = MODEL_PRESETS["mixtral-8x7b"]
    casts = Fp8Casts(weight_casts_per_microbatch=1.0)
    shape = LayerShape(spec, 1, 4096, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True, fp8_casts=casts)
    blocks = moe_forward_ops(shape, 1, 4, 4 * 1024.0)
    ops = {op.name: op for op in blocks["moe_experts"]}
    # TE's cast+transpose reads 2 bytes and writes 1 + 1 per element: 4 local experts x (2 x 14336) x 4096.
    assert ops["experts_fc1_weight_cast"].bytes == 4 * 2 * 14336 * 4096 * 4.0
    assert ops["experts_fc1_input_cast"].bytes == 4 * 1024 * 4096 * 4.0


# ------------------------------------------------------------------------------------------ activation memory


def test_moe_layer_activations_closed_form_mixtral():
    """Korthikanti et al. 2022 Table 2's per-layer terms with the MLP's replaced: a dense SwiGLU MLP keeps its
    fc1 output and activation output, 6f bytes per token; a MoE layer keeps, per token routed to k experts,
    the router's scores (2E), the permuted tokens (2kh), the experts' fc1 and activation outputs (6kf) and the
    expert outputs before the top-k weighted sum (2kh)."""
    spec = MODEL_PRESETS["mixtral-8x7b"]
    s, b, h, kv, f, E, k = 4096, 1, 4096, 1024, 14336, 8, 2
    T = s * b
    attention = T * (10 * h + 2 * h + 2 * kv + 2 * kv + 2 * h) + 4 * b * 32 * s  # + flash's fp32 LSE
    moe = 2 * T * E + 2 * T * k * h + 6 * T * k * f + 2 * T * k * h
    assert activation_bytes_per_layer(spec, b, s, 1, False, "none", True, moe=True, routed_tokens=T * k) == \
        pytest.approx(attention + moe, rel=1e-12)
    dense = activation_bytes_per_layer(spec, b, s, 1, False, "none", True)
    assert dense == pytest.approx(attention + 6 * T * f, rel=1e-12)
    # Full recompute keeps the layer input only, MoE or not.
    assert activation_bytes_per_layer(spec, b, s, 1, False, "full", moe=True, routed_tokens=T * k) == 2 * T * h


def test_moe_layer_activations_shard_experts_by_etp_and_the_rest_by_tp():
    spec = MODEL_PRESETS["deepseek-v3"]
    s, b, tp, etp = 4096, 1, 4, 2
    h, E, k, f_moe, f_shared, heads = 7168, 256, 8, 2048, 2048, 128
    T = s * b
    routed = 3.0 * T * k / tp  # a rank that receives 3x its uniform share
    latents = 2 * T * (2 * 1536 + 2 * 512 + 64)  # q and kv latents and their norms' outputs, whole on every rank
    attention = (10 * T * h / tp  # sequence parallel: the replicated 10sbh divided by tp
                 + T * heads * (2 * 192 + 2 * 192 + 2 * 128 + 2 * 128) / tp + 4 * b * heads * s / tp + latents)
    shared = T * 6 * f_shared / tp
    rank_tokens = T / tp
    experts = 2 * rank_tokens * E + 2 * routed * h + routed * 6 * f_moe / etp + 2 * rank_tokens * k * h
    got = activation_bytes_per_layer(spec, b, s, tp, True, "selective", True, moe=True, routed_tokens=routed,
                                     etp=etp)
    assert got == pytest.approx(attention + shared + experts, rel=1e-12)


def test_gpt_oss_sliding_window_layers_run_a_band_of_tiles():
    """GPT-OSS attends over 128 tokens on even (0-based) layers: the flash kernel runs query tile i against key
    tiles i-1 and i (128-token tiles), 1 + 2 x 31 of 32^2 at 4096 tokens; the full layers run the causal
    33/64. The model FLOPs keep Megatron's full-matrix count."""
    from sim.model.flash_tiles import window_fraction

    spec = MODEL_PRESETS["gpt-oss-120b"]
    assert spec.window_layers == (True, False) * 18
    assert window_fraction(4096, 128) == 63 / 1024
    shape = LayerShape(spec, 1, 4096, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True, causal=True)
    ops = {op.name: op for op in attention_forward_ops(shape)}
    assert ops["flash_attention"].executed == pytest.approx((18 * 33 / 64 + 18 * 63 / 1024) / 36, rel=1e-15)
    assert ops["flash_attention"].flops == 4 * 64 * 4096 * 4096 * 64
    dense = {op.name: op for op in attention_forward_ops(replace(shape, spec=MODEL_PRESETS["llama3-8b"]))}
    assert dense["flash_attention"].executed == 33 / 64


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-13b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3",
                                  "gpt-oss-120b"])
@pytest.mark.parametrize("tp", [1, 4])
def test_layer_modules_sum_to_the_tp_rank_params(name, tp):
    """The leaf modules a framework wraps (FSDP units) hold exactly a TP rank's dense parameters, MoE layers'
    router and shared expert included, routed experts not."""
    from sim.model.params import layer_modules

    spec = MODEL_PRESETS[name]
    for moe in ((False, True) if spec.is_moe else (False,)):
        modules = layer_modules(spec, tp, moe=moe)
        assert sum(m.params for m in modules) == pytest.approx(layer_params(spec, moe).per_tp_rank(tp), rel=1e-12)
        assert len({m.name for m in modules}) == len(modules)

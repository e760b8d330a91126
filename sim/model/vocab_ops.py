"""The kernels at the model's two vocabulary ends on one TP rank: the embedding lookup and the LM head.

In: a ``ModelSpec`` (sim.model.transformer), the micro-batch, sequence length, TP split, dtype size and the
loss implementation (``training.cross_entropy``). Out: ``Op`` tuples: the lookup; the final norm,
vocab-parallel logits GEMM and cross-entropy (fp32 logits): one fused kernel (``fused``, ``hf`` after its upcast)
or, for ``megatron``, the kernels Megatron-Core's unfused ``VocabParallelCrossEntropy`` issues, each in its pass.
"""

from __future__ import annotations

from sim.model.ops import Op, elementwise, gemm
from sim.model.transformer import ModelSpec


def embedding_forward_ops(spec: ModelSpec, micro_batch: int, seq_len: int, elem_bytes: int) -> tuple[Op, ...]:
    """The embedding lookup: the micro-batch's tokens x hidden_size read from the table and written once."""
    tokens = micro_batch * seq_len
    return (elementwise("embedding_lookup", tokens * spec.hidden_size, elem_bytes, reads=1, writes=1),)


# Megatron-Core's unfused vocab-parallel cross entropy (``training.cross_entropy: megatron``), kernel by kernel:
# megatron/core/tensor_parallel/cross_entropy.py at 1e05700595 (2025-05-24), ``_VocabParallelCrossEntropy``,
# which compute_language_model_loss (models/common/language_module/language_module.py) calls without
# --cross-entropy-loss-fusion. (bytes read, bytes written) per logit element of the [tokens, vocab / tp] shard, the
# logits bf16 (the output layer's dtype), everything after the cast fp32:
MEGATRON_CE_FORWARD: tuple[tuple[str, float, float], ...] = (
    ("ce_upcast", 2.0, 4.0),  # calculate_logits_max: vocab_parallel_logits.float()
    ("ce_max", 4.0, 0.0),  # torch.max(vocab_parallel_logits, dim=-1): one value (and index) per token written
    ("ce_sub_max", 4.0, 4.0),  # calculate_predicted_logits: vocab_parallel_logits -= logits_max (in place)
    ("ce_exp", 4.0, 4.0),  # torch.exp(vocab_parallel_logits, out=exp_logits) (in place)
    ("ce_sum_exp", 4.0, 0.0),  # exp_logits.sum(dim=-1)
    ("ce_softmax", 4.0, 4.0),  # calculate_cross_entropy_loss: exp_logits.div_(sum_exp_logits) (saved: the softmax)
)
MEGATRON_CE_BACKWARD: tuple[tuple[str, float, float], ...] = (
    ("ce_grad_scale", 4.0, 4.0),  # calculate_gradients: grad_input.mul_(grad_output.unsqueeze(-1)) (in place)
    # The Function returns the fp32 softmax gradient for its bf16 input; autograd's engine casts a gradient to
    # its input's dtype (engine.cpp validate_outputs: grad.to(metadata dtype)): read fp32, write bf16.
    ("ce_grad_downcast", 4.0, 2.0),
)
# The per-token kernels around them (label_smoothing 0), counted in the same code: forward, the target mask
# (<, >=, |), clone, subtract the vocab start, masked_fill of the masked target, arange, the gather
# logits_2d[arange, masked_target], its clone, masked_fill of the predicted logits, log(sum_exp), the subtraction:
# 12 kernels; backward, target_mask.float(), 1 - it, arange, and grad_2d[arange, masked_target] -= softmax_update
# (index, subtract, index_put_): 6 kernels. Bytes per token (int64 targets, one-byte masks, fp32 values, each
# kernel's reads + writes in that order): 9 + 9 + 3 + 16 + 16 + 17 + 8 + 24 + 8 + 9 + 8 + 12 = 139 forward;
# 5 + 8 + 8 + 24 + 12 + 24 = 81 backward. Next to a vocab shard of tens of thousands of elements these bytes are
# nothing; the kernels are priced at the launch floor.
MEGATRON_CE_TOKEN_KERNELS = (12, 6)
MEGATRON_CE_TOKEN_BYTES = (139.0, 81.0)


def megatron_cross_entropy_ops(tokens: float, vocab_local: float) -> tuple[Op, ...]:
    """Megatron-Core's unfused ``VocabParallelCrossEntropy`` on one TP rank's [tokens, vocab_local] logits: the six
    full-shard forward kernels (``MEGATRON_CE_FORWARD``, 38 bytes per logit element, run in the forward only), the
    two backward ones (``MEGATRON_CE_BACKWARD``, 14 bytes, run in the input-gradient pass only) and the per-token
    kernels of each pass. Its three TP all-reduces over [tokens] fp32 (max, predicted logit, sum of exps) are
    ``loss_tp_collectives``."""
    logits = tokens * vocab_local
    forward = tuple(Op(name, 0.0, logits * (read + write), False, runs_in="forward")
                    for name, read, write in MEGATRON_CE_FORWARD)
    backward = tuple(Op(name, 0.0, logits * (read + write), False, runs_in="input_grad")
                     for name, read, write in MEGATRON_CE_BACKWARD)
    (kernels_f, kernels_b), (bytes_f, bytes_b) = MEGATRON_CE_TOKEN_KERNELS, MEGATRON_CE_TOKEN_BYTES
    return (*forward, Op("ce_target", 0.0, tokens * bytes_f, False, runs_in="forward", kernels=kernels_f),
            *backward, Op("ce_target_grad", 0.0, tokens * bytes_b, False, runs_in="input_grad", kernels=kernels_b))


def loss_tp_collectives(tokens: float, tp: int, cross_entropy: str) -> tuple[tuple[str, float], ...]:
    """The loss's own TP collectives in its forward, (op, bytes) in issue order: Megatron's unfused loss
    all-reduces three [tokens] fp32 vectors over the TP group (``_VocabParallelCrossEntropy.forward``: the logits'
    max, ReduceOp.MAX; the predicted logits and the sums of exps, ReduceOp.SUM), each waited for by the next
    kernel; none without TP, and none for the fused kernel's model (``fused``, ``hf``: priced as before)."""
    if cross_entropy != "megatron" or tp == 1:
        return ()
    return (("all_reduce", tokens * 4.0),) * 3


def head_forward_ops(spec: ModelSpec, micro_batch: int, seq_len: int, tp: int, elem_bytes: int,
                     cross_entropy: str = "fused") -> tuple[Op, ...]:
    """Final norm, vocab-parallel logits GEMM and cross-entropy (fp32 logits) on one TP rank. The logits GEMM is
    not a Transformer Engine module (Megatron-LM's output_layer is tensor_parallel.ColumnParallelLinear,
    gpt_model.py) and runs outside the decoder's fp8_autocast (transformer_block.py), so it stays bf16 under
    FP8 training (``te_linear`` false). ``cross_entropy`` (``training.cross_entropy``): "fused" one kernel reading
    two fp32 tensors and writing one per logit element (12 bytes; the backward by the weightless-op rule, 2x);
    "hf": Hugging Face's loss first materialises the logits in fp32 (read 16-bit, write fp32; in the backward the
    gradient is cast back and copied into the unshifted shape, the weightless op's 2x), then log_softmax and
    nll_loss as the fused kernel; "megatron": Megatron-Core's unfused kernels (``megatron_cross_entropy_ops``)."""
    tokens = micro_batch * seq_len
    vocab_local = spec.vocab_size / tp
    logits = tokens * vocab_local
    head = (elementwise("final_norm", tokens * spec.hidden_size, elem_bytes, reads=1, writes=1),
            gemm("logits", tokens, vocab_local, spec.hidden_size, elem_bytes))
    if cross_entropy == "megatron":
        return (*head, *megatron_cross_entropy_ops(tokens, vocab_local))
    upcast = (elementwise("logits_upcast", logits, 2, reads=1, writes=2),) if cross_entropy == "hf" else ()
    return (*head, *upcast, elementwise("cross_entropy", tokens * vocab_local, 4, reads=2, writes=1))

"""The kernels at the model's two vocabulary ends on one TP rank: the embedding lookup and the LM head.

In: a ``ModelSpec`` (sim.model.transformer), the micro-batch, sequence length, TP split, dtype size and the
loss implementation (``training.cross_entropy``). Out: ``Op`` tuples: the lookup; the final norm,
vocab-parallel logits GEMM and cross-entropy (fp32 logits).
"""

from __future__ import annotations

from sim.model.ops import Op, elementwise, gemm
from sim.model.transformer import ModelSpec


def embedding_forward_ops(spec: ModelSpec, micro_batch: int, seq_len: int, elem_bytes: int) -> tuple[Op, ...]:
    """The embedding lookup: the micro-batch's tokens x hidden_size read from the table and written once."""
    tokens = micro_batch * seq_len
    return (elementwise("embedding_lookup", tokens * spec.hidden_size, elem_bytes, reads=1, writes=1),)


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
    upcast = (elementwise("logits_upcast", logits, 2, reads=1, writes=2),) if cross_entropy == "hf" else ()
    return (
        elementwise("final_norm", tokens * spec.hidden_size, elem_bytes, reads=1, writes=1),
        gemm("logits", tokens, vocab_local, spec.hidden_size, elem_bytes),
        *upcast,
        elementwise("cross_entropy", tokens * vocab_local, 4, reads=2, writes=1),
    )

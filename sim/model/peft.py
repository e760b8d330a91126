"""Parameter-efficient fine-tuning: which parameters train, what the adapters add, and how frozen weights are stored.

In: a ``ModelSpec``, the resolved method (``Peft``: full, lora, qlora or frozen, with LoRA's rank, targets and
dropout and the frozen layers) and the TP degree. Out, per TP rank: the trainable and frozen parameters of a
layer and of the embedding and head, the bytes frozen weights take in their storage dtype, the adapter's extra
kernels (``adapter_ops``: the A and B GEMMs by shape, LoRA dropout, the scaled add, QLoRA's dequantisation) and
the activations the adapters keep for the backward.

Sources:
- LoRA (Hu et al. ICLR 2022): W x + (alpha / r) B A x, A: r x in, B: out x r; only A and B train. Hugging Face
  PEFT's ``LoraConfig`` names (r, lora_alpha, target_modules, lora_dropout) and Llama's module names
  (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj). PEFT's ``lora.Linear.forward``
  (peft/tuners/lora/layer.py): ``result = base_layer(x); result += lora_B(lora_A(dropout(x))) * scaling``, the
  dropout an ``nn.Identity`` when lora_dropout is 0. Trainable parameters of Llama 3 8B, r = 8, all seven
  projections: 20,971,520 (LLaMA-Factory's log, ``trainable params: 20,971,520 || all params: 8,051,232,768``);
  r = 16: 41,943,040 (PEFT ``print_trainable_parameters``). tests/test_peft.py checks both.
- QLoRA (Dettmers et al. NeurIPS 2023, Sec. 3): base weights in 4-bit NormalFloat, blocks of 64 weights, one
  fp32 absmax constant per block (32/64 = 0.5 bit per parameter); double quantisation stores those constants
  in 8 bits with one fp32 constant per 256 of them: 8/64 + 32/(64*256) = 0.127 bit per parameter. bitsandbytes
  quantises the ``nn.Linear`` layers of the decoder, not the embedding, the norms or ``lm_head`` (transformers'
  ``get_keys_to_not_convert``). Its ``MatMul4Bit`` dequantises the whole weight to the compute dtype before the
  GEMM in the forward and again for the input gradient in the backward (bitsandbytes/autograd/_functions.py).
- Frozen parameters get no gradient and no optimizer state (``requires_grad=False``); a frozen linear's backward
  is its input-gradient GEMM only (the weight-gradient GEMM is skipped by autograd).

Tensor parallelism (NeMo/Megatron LoRA, ``ParallelLinearAdapter``): on a column-parallel linear the A matrix is
whole on every TP rank and B is split by output; on a row-parallel one A is split by input and B is whole.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from sim.model.flops import layer_forward_flops, logits_forward_flops
from sim.model.layer_shape import LayerShape
from sim.model.ops import Op
from sim.model.params import embedding_params, head_params, layer_params
from sim.model.transformer import ModelSpec

Method = Literal["full", "lora", "qlora", "frozen"]
# Hugging Face PEFT's Llama target module names, in forward order.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Which of the simulator's fused linears (sim.model.attention_ops, sim.model.mlp_ops) each target belongs to.
FUSED_LINEAR = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "o_proj": "out_proj",
                "gate_proj": "mlp_up", "up_proj": "mlp_up", "down_proj": "mlp_down"}
ROW_PARALLEL_TARGETS = frozenset({"o_proj", "down_proj"})

# QLoRA's NF4 storage (Dettmers et al. 2023, Sec. 3): 4 bits per weight, plus the quantisation constants.
NF4_BITS = 4.0
NF4_BLOCK = 64  # weights per first-level absmax constant (bitsandbytes blocksize)
DOUBLE_QUANT_BLOCK = 256  # first-level constants per second-level fp32 constant


def nf4_bits_per_param(double_quant: bool = True, block: int = NF4_BLOCK) -> float:
    """Bits one NF4 weight takes with its share of the constants: 4 + 32/64 = 4.5 without double quantisation,
    4 + 8/64 + 32/(64*256) = 4.127 with it (QLoRA Sec. 3)."""
    constants = 8.0 / block + 32.0 / (block * DOUBLE_QUANT_BLOCK) if double_quant else 32.0 / block
    return NF4_BITS + constants


@dataclass(frozen=True)
class Peft:
    """The resolved fine-tuning method. ``full``: every parameter trains (the default; nothing here changes).
    ``lora`` / ``qlora``: the base model is frozen (QLoRA's decoder linears in NF4) and rank-``rank`` adapters on
    ``targets`` train. ``frozen``: full training except ``frozen_layers`` (and the embedding if
    ``frozen_embedding``), which keep their weights and get no gradients."""

    method: Method = "full"
    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = TARGETS
    dropout: float = 0.0
    double_quant: bool = True
    quant_block: int = NF4_BLOCK
    frozen_layers: frozenset[int] = frozenset()
    frozen_embedding: bool = False

    @property
    def active(self) -> bool:
        """Whether anything is frozen (``full``: the simulator's original training step, unchanged)."""
        return self.method != "full"

    @property
    def adapters(self) -> bool:
        return self.method in ("lora", "qlora")

    def layer_frozen(self, layer: int) -> bool:
        """Whether transformer layer ``layer``'s own weights are frozen."""
        return self.adapters or (self.method == "frozen" and layer in self.frozen_layers)

    @property
    def embedding_trainable(self) -> bool:
        return not (self.adapters or self.frozen_embedding)

    @property
    def head_trainable(self) -> bool:
        return not self.adapters

    def linear_bytes_per_param(self, elem_bytes: float) -> float:
        """Bytes of a frozen decoder linear weight: NF4 with its constants under QLoRA, else the compute dtype."""
        return nf4_bits_per_param(self.double_quant, self.quant_block) / 8 if self.method == "qlora" else elem_bytes


# -------------------------------------------------------------------------------------------- shapes


def target_shape(spec: ModelSpec, target: str) -> tuple[int, int]:
    """(in_features, out_features) of a target projection of ``spec`` (whole, before TP)."""
    h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn
    return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h), "gate_proj": (h, f),
            "up_proj": (h, f), "down_proj": (f, h)}[target]


def adapter_shapes(spec: ModelSpec, target: str, rank: int, tp: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((in, r), (r, out)) of the A and B matrices on one TP rank, as GEMM operand shapes."""
    fan_in, fan_out = target_shape(spec, target)
    if target in ROW_PARALLEL_TARGETS:
        return (fan_in / tp, rank), (rank, fan_out)
    return (fan_in, rank), (rank, fan_out / tp)


def adapter_params(spec: ModelSpec, peft: Peft, tp: int = 1) -> float:
    """Trainable LoRA parameters of one layer on one TP rank: r * (in + out) per target at tp = 1."""
    if not peft.adapters:
        return 0.0
    total = 0.0
    for target in peft.targets:
        (a_in, a_out), (b_in, b_out) = adapter_shapes(spec, target, peft.rank, tp)
        total += a_in * a_out + b_in * b_out
    return total


def layer_trainable_params(spec: ModelSpec, peft: Peft, layer: int, tp: int = 1) -> float:
    """Parameters of transformer layer ``layer`` that get gradients, per TP rank."""
    if peft.adapters:
        return adapter_params(spec, peft, tp)
    return 0.0 if peft.layer_frozen(layer) else layer_params(spec).per_tp_rank(tp)


def layer_frozen_params(spec: ModelSpec, peft: Peft, layer: int, tp: int = 1) -> float:
    """Parameters of transformer layer ``layer`` held frozen, per TP rank (the whole base layer under LoRA)."""
    return layer_params(spec).per_tp_rank(tp) if peft.layer_frozen(layer) else 0.0


def layer_frozen_bytes(spec: ModelSpec, peft: Peft, layer: int, tp: int, elem_bytes: float) -> float:
    """Bytes of layer ``layer``'s frozen weights on one TP rank in their storage dtype: QLoRA's linear weights
    (the sharded ones: weight matrices; Llama has no biases) in NF4, norms and biases in the compute dtype."""
    if not peft.layer_frozen(layer):
        return 0.0
    params = layer_params(spec)
    if peft.method != "qlora":
        return params.per_tp_rank(tp) * elem_bytes
    return params.sharded / tp * peft.linear_bytes_per_param(elem_bytes) + params.replicated * elem_bytes


def embedding_split(spec: ModelSpec, peft: Peft) -> tuple[float, float]:
    """(trainable, frozen) parameters of the input embedding (whole; divide by tp for a rank)."""
    params = float(embedding_params(spec))
    return (params, 0.0) if peft.embedding_trainable else (0.0, params)


def head_split(spec: ModelSpec, peft: Peft) -> tuple[float, float]:
    """(trainable, frozen) parameters of the final norm and LM head (whole)."""
    params = float(head_params(spec))
    return (params, 0.0) if peft.head_trainable else (0.0, params)


def trainable_params(spec: ModelSpec, peft: Peft) -> float:
    """Parameters that train in the whole model (what PEFT's ``print_trainable_parameters`` reports)."""
    layers = sum(layer_trainable_params(spec, peft, layer) for layer in range(spec.num_layers))
    return layers + embedding_split(spec, peft)[0] + head_split(spec, peft)[0]


# --------------------------------------------------------------------------------------------- kernels


def adapter_ops(spec: ModelSpec, peft: Peft, tokens: float, tp: int, elem_bytes: int,
                fused_kernels: bool = True) -> dict[str, tuple[Op, ...]]:
    """The kernels each target's adapter adds to its block's forward on one TP rank, by block (attention, mlp):
    LoRA dropout on the input (when ``dropout`` > 0: read x, write x and a one-byte mask), the A GEMM
    (tokens x in -> r) and the B GEMM (tokens x r -> out), both trainable, and the scaled add into the base
    output (PEFT: ``lora_B(...) * scaling`` then ``+=``: two kernels, one under ``fused_kernels``)."""
    blocks: dict[str, list[Op]] = {"attention": [], "mlp": []}
    if not peft.adapters:
        return {}
    for target in peft.targets:
        (a_in, rank), (_, b_out) = adapter_shapes(spec, target, peft.rank, tp)
        block = "attention" if target in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        ops = blocks[block]
        if peft.dropout > 0:
            ops.append(Op(f"lora_{target}_dropout", 0.0, float(tokens * a_in * (2 * elem_bytes + 1)), False))
        ops.append(_adapter_gemm(f"lora_{target}_A", tokens, rank, a_in, elem_bytes))
        ops.append(_adapter_gemm(f"lora_{target}_B", tokens, b_out, rank, elem_bytes))
        kernels = 1 if fused_kernels else 2  # mul by scaling, then the in-place add
        reads, writes = (2, 1) if fused_kernels else (3, 2)
        ops.append(Op(f"lora_{target}_scale_add", 0.0, float(tokens * b_out * elem_bytes * (reads + writes)), False,
                      kernels=kernels))
    return {name: tuple(ops) for name, ops in blocks.items()}


def _adapter_gemm(name: str, m: float, n: float, k: float, elem: int) -> Op:
    """A trainable adapter GEMM (tokens m, out n, in k): forward, input gradient and weight gradient."""
    shape = (1, round(m), round(n), round(k))
    return Op(name, 2.0 * m * n * k, float(elem * (m * k + k * n + m * n)), True, True, shape)


def dequant_ops(op: Op, peft: Peft, elem_bytes: int) -> tuple[Op, ...]:
    """QLoRA: the dequantisation kernels of a frozen NF4 linear ``op`` (none otherwise): before its forward GEMM
    and again before its input-gradient GEMM, each reading the NF4 weight with its constants and writing it in
    the compute dtype (memory-bound; bitsandbytes ``dequantize_4bit``)."""
    if peft.method != "qlora" or not op.has_weights or op.shape is None:
        return ()
    _, _, out_features, in_features = op.shape
    weights = float(out_features) * in_features
    nbytes = weights * (peft.linear_bytes_per_param(elem_bytes) + elem_bytes)
    return (Op(f"{op.name}_dequant", 0.0, nbytes, False, runs_in="forward"),
            Op(f"{op.name}_dequant_bwd", 0.0, nbytes, False, runs_in="input_grad"))


def dequant_buffer_bytes(spec: ModelSpec, peft: Peft, tp: int, elem_bytes: int) -> float:
    """QLoRA: bytes of the largest frozen decoder linear dequantised to the compute dtype on one TP rank (0 for
    the other methods). The dequantised weight is a whole temporary tensor that lives through its GEMM, in the
    forward and again in the input-gradient GEMM: torchao's ``LinearNF4`` (torchtune's QLoRA) runs
    ``F.linear(input, weight.to(input.dtype))`` and ``grad_output @ weight.to(grad_output.dtype)``
    (torchao/dtypes/nf4tensor.py), bitsandbytes' ``MatMul4Bit`` ``dequantize_4bit(B, state).to(A.dtype)``
    (bitsandbytes/autograd/_functions.py). The memory rule counts one, the largest (an MLP projection, h x ffn),
    beside the activations at the backward's peak: Llama 3 8B 4096 x 14336 x 2 B = 112 MiB, 70B 448 MiB."""
    if peft.method != "qlora":
        return 0.0
    return max(fan_in * fan_out for fan_in, fan_out in (target_shape(spec, t) for t in TARGETS)) / tp * elem_bytes


def adapt_layer_ops(blocks: dict[str, tuple[Op, ...]], shape: LayerShape, peft: Peft) -> dict[str, tuple[Op, ...]]:
    """A layer's forward kernels (sim.model.layer_ops.layer_forward_ops of ``shape``, sim.model.layer_shape)
    under LoRA/QLoRA: the base linears frozen (``Op.trainable`` false: no weight-gradient GEMM), each preceded by
    its dequantisation under QLoRA, and the adapters' kernels (over ``shape``'s tokens, tp, dtype size and fused
    or eager kernels) appended to their block."""
    if not peft.adapters:
        return blocks
    elem_bytes = shape.elem_bytes
    extra = adapter_ops(shape.spec, peft, shape.tokens, shape.tp, elem_bytes, shape.fused_kernels)
    out = {}
    for name, ops in blocks.items():
        adapted: list[Op] = []
        for op in ops:
            if op.has_weights:
                adapted += dequant_ops(op, peft, elem_bytes)
                op = frozen(op)
            adapted.append(op)
        out[name] = tuple(adapted) + extra.get(name, ())
    return out


def frozen(op: Op) -> Op:
    """``op`` with its weights frozen: the backward runs its input-gradient GEMM only."""
    return replace(op, trainable=False)


# ------------------------------------------------------------------------------------------ activations


def adapter_activation_bytes(spec: ModelSpec, peft: Peft, tokens: float, tp: int, elem_bytes: int) -> float:
    """Bytes one layer's adapters keep for the backward per micro-batch on one TP rank, beyond the base layer's
    (whose linear inputs, which the A GEMMs reuse, sim.model.memory already counts): each A output
    (tokens x r, B's weight gradient needs it) and, with LoRA dropout, the dropped input and its one-byte mask
    (tokens x in, A's weight gradient reads it)."""
    if not peft.adapters:
        return 0.0
    total = 0.0
    for target in peft.targets:
        (a_in, rank), _ = adapter_shapes(spec, target, peft.rank, tp)
        total += tokens * rank * elem_bytes
        if peft.dropout > 0:
            total += tokens * a_in * (elem_bytes + 1)
    return total


# ------------------------------------------------------------------------------------------- model FLOPs


def model_flops_per_step(spec: ModelSpec, peft: Peft, global_batch: int, seq_len: int) -> float:
    """Model FLOPs of one step under ``peft`` (MFU's numerator; sim.model.flops.model_flops_per_step in
    full training, which it equals there). Per sequence and layer: the forward's GEMMs and attention, a backward
    of twice the attention and of each linear GEMM twice where its weights train and once (the input gradient)
    where they are frozen; LoRA's adapters three times their forward. The LM head: three times its forward if
    it trains, twice if frozen. Without recomputation, as Korthikanti et al. 2022 eq. 7 counts."""
    h, kv, f = spec.hidden_size, spec.kv_dim, spec.ffn
    linear = 2.0 * seq_len * (h * (h + 2 * kv) + h * h + spec.mlp_matrices * h * f)
    attention = layer_forward_flops(spec, 1, seq_len) - linear
    adapters = 2.0 * seq_len * adapter_params(spec, peft)
    total = 0.0
    for layer in range(spec.num_layers):
        weights = 2.0 if peft.layer_frozen(layer) else 3.0
        total += weights * linear + 3.0 * attention + 3.0 * adapters
    total += (3.0 if peft.head_trainable else 2.0) * logits_forward_flops(spec, 1, seq_len)
    return global_batch * total

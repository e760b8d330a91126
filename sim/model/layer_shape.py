"""What every op builder of a layer reads: the per-rank shape of one micro-batch's pass and the kernel options.

In: a ``ModelSpec`` (sim.model.transformer), the micro-batch, sequence length, TP split, sequence parallelism,
dtype size and the kernel options (flash attention, Megatron's fused kernels or eager PyTorch, FP8's cast kernels,
causal attention, fused RMSNorm/RoPE). Out: one frozen ``LayerShape``, passed whole to the builders of
sim.model.attention_ops, sim.model.mlp_ops, sim.model.layer_ops and sim.model.moe_ops, with the quantities they
share derived once (tokens, the tokens each TP rank repeats, the norm kernel). sim.workload.blocks.layer_shape
builds it from the Plan, in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

from sim.model.fp8_casts import Fp8Casts
from sim.model.ops import Op, eager_norm, elementwise
from sim.model.transformer import ModelSpec


@dataclass(frozen=True)
class LayerShape:
    """One layer's forward pass on one TP rank, as the op builders read it (Megatron-Core's TransformerConfig
    plays this part for its modules: one record every layer module reads).

    ``spec``, ``micro_batch`` (sequences), ``seq_len`` (the rank's tokens per sequence: s/cp under context
    parallelism) and ``tp`` are positional; the rest by name:

    - ``sequence_parallel``: Megatron's sequence parallelism, which divides the norm/dropout/residual work by tp
      (without it every TP rank repeats it).
    - ``elem_bytes``: bytes per activation element of the compute dtype.
    - ``flash_attention``: the fused attention kernel (Dao et al. 2022) rather than scores, softmax and values.
    - ``fused_kernels``: Megatron-LM's fused norm, bias-activation and dropout-add kernels (one read and one write
      per tensor); without it, the unfused element-wise kernels of a PyTorch eager Llama (sim.model.ops:
      ``EAGER_RMSNORM_BYTES``, ``EAGER_ROPE_BYTES``).
    - ``fp8_casts``: FP8 training's cast/transpose kernels around each linear GEMM (sim.model.fp8_casts); None: none.
    - ``causal``: flash attention skips the score tiles above the diagonal (sim.model.flash_tiles); the unfused
      path computes the full s x s matrix and masks it, as Megatron-LM's fused masked softmax does.
    - ``fused_norm_rope``: the RMSNorm and rotary kernels fused (one read, one write) or eager whatever
      ``fused_kernels`` says (None: as it says), for eager modelling code calling flash-attn's fused kernels.
    """

    spec: ModelSpec
    micro_batch: int
    seq_len: int
    tp: int
    _: KW_ONLY
    sequence_parallel: bool
    elem_bytes: int
    flash_attention: bool
    fused_kernels: bool = True
    fp8_casts: Fp8Casts | None = None
    causal: bool = False
    fused_norm_rope: bool | None = None

    @property
    def tokens(self) -> int:
        """The micro-batch's tokens on this rank, b x s: the rows of every column- and row-parallel GEMM."""
        return self.micro_batch * self.seq_len

    @property
    def replicated_tokens(self) -> float:
        """The tokens this rank's norms, dropouts, residuals and duplicated linears run on: b*s/tp under sequence
        parallelism (each TP rank its own slice), all b*s without (every TP rank repeats them)."""
        return self.tokens / self.tp if self.sequence_parallel else self.tokens

    @property
    def norm_rope_fused(self) -> bool:
        """Whether the RMSNorm and RoPE kernels are fused: ``fused_norm_rope`` where given, else ``fused_kernels``."""
        return self.fused_kernels if self.fused_norm_rope is None else self.fused_norm_rope

    @property
    def norm(self) -> Callable[..., Op]:
        """The constructor of a norm's kernel: eager PyTorch's RMSNorm (sim.model.ops.eager_norm, eight kernels)
        where RMSNorm runs unfused, else one element-wise pass. Eager PyTorch's LayerNorm is one fused ATen kernel
        (aten/src/ATen/native/cuda/layer_norm_kernel.cu: one read, one write); only RMSNorm written in Python
        (HF/FMS LlamaRMSNorm) runs as eight."""
        return eager_norm if not self.norm_rope_fused and self.spec.norm == "rmsnorm" else elementwise

"""The Plan's dtypes and bytes: per element, per parameter's weight, gradient and optimizer states, per message.

In: the training dtype knobs (``training.dtype``, ``grad_dtype``, ``master_weights``, ``optimizer_dtype``) and the
degrees and batch (``GridFacts``). Out: ``DtypeFacts``: the element bytes of activations and 16-bit weights; the
dtype gradients are reduced and stored in (Megatron-LM's fp32 main gradients, FSDP's cast back); bytes per parameter
of weights, gradients and optimizer states, and what the Adam step moves; and the bytes of one TP collective and one
pipeline send (Megatron's b x s x h, the p2p tensor scattered over the TP group).
"""

from __future__ import annotations

from sim.hardware.dtypes import bytes_per_element, parameter_dtype
from sim.model.memory import (
    adam_step_bytes_per_param,
    model_state_bytes,
    optimizer_bytes_per_param,
)
from sim.plan.cached import cached_property
from sim.plan.grid import GridFacts


class DtypeFacts(GridFacts):
    """Dtypes and bytes per element, parameter and message (a base of ``sim.plan.Plan``)."""

    # -------------------------------------------------------------------------------------------------- dtypes
    @cached_property
    def dtype(self) -> str:
        return self.scenario.training.dtype

    @cached_property
    def elem_bytes(self) -> int:
        """Bytes of one activation or 16-bit weight element in the training dtype."""
        return bytes_per_element(self.dtype)

    @cached_property
    def grad_dtype(self) -> str:
        """The dtype gradients are accumulated and reduced in (``training.grad_dtype``, ``auto`` resolved).
        Megatron-LM: "bfloat16 requires gradient accumulation and all-reduce to be done in fp32"
        (arguments.py: accumulate_allreduce_grads_in_fp32), so 2 + 4 + 12 = 18 bytes per parameter; fp16 keeps
        fp16 grads. Sharded gradients (ZeRO-2/3, FSDP MixedPrecision reduce_dtype) stay in the parameters' dtype.
        FP8 training (Transformer Engine) runs only the GEMMs in FP8: the parameters and their gradients are
        bf16, so Megatron-LM keeps fp32 main gradients as for bf16 (issue 22: fp8 had dropped them).
        Without master weights (``training.master_weights: false``, pure 16-bit training as torchtune's) autograd
        accumulates into the parameters' own .grad, in their dtype."""
        t = self.scenario.training
        if t.grad_dtype != "auto":
            return t.grad_dtype
        params = parameter_dtype(t.dtype)
        if params == "fp32" or not t.master_weights:
            return params
        sharded_grads = self.scenario.fsdp is not None or self.zero_stage >= 2
        return "fp32" if params == "bf16" and not sharded_grads else params

    @cached_property
    def weight_bytes_per_param(self) -> int:
        """Bytes of a working (compute-dtype) weight: 4 for fp32/tf32 training, else 2 (mixed precision; FP8
        GEMMs cast from the 16-bit weights)."""
        return int(model_state_bytes(1.0, self.dtype).weights)

    @cached_property
    def grad_bytes_per_param(self) -> int:
        """Bytes of a gradient element as accumulated and reduced (``grad_dtype``): the DP/FSDP message sizes."""
        return bytes_per_element(self.grad_dtype)

    @cached_property
    def grad_storage_dtype(self) -> str:
        """The dtype of the gradients kept from the backward to the optimizer step, which Adam reads (memory
        model, optimizer step). It is ``grad_dtype`` except without master weights (pure 16-bit training), where
        the gradient is the parameter's own ``.grad`` in the parameters' dtype whatever the reduce dtype: FSDP2
        reduce-scatters in ``reduce_dtype`` and casts the result back to the sharded parameter's dtype before
        storing it (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_reduce:
        ``_to_dtype_if_needed(reduce_output, orig_dtype)`` -> ``sharded_param.grad``; FSDP1 likewise,
        ``_cast_grad_to_param_dtype``). So TorchTitan's ``[training] dtype = "bfloat16"`` with its default
        ``mixed_precision_reduce = "float32"`` reduces in fp32 and stores bf16 gradients. That cast back is the
        sharded gradients' (FSDP, ZeRO-2/3); unsharded ones (DDP, ZeRO-1) stay in the buffer the buckets reduce,
        in ``grad_dtype`` (Megatron-LM's main-gradient buffer, ``main_grad_buffer``, which the memory model counts
        as the gradients themselves, with no bucket copy beside them)."""
        t = self.scenario.training
        sharded = self.scenario.fsdp is not None or self.zero_stage >= 2
        return parameter_dtype(t.dtype) if not t.master_weights and sharded else self.grad_dtype

    @cached_property
    def grad_storage_bytes_per_param(self) -> int:
        """Bytes of a stored gradient element (``grad_storage_dtype``)."""
        return bytes_per_element(self.grad_storage_dtype)

    @cached_property
    def optimizer_bytes_per_param(self) -> int:
        """Bytes of optimizer states per trained parameter (``training.master_weights``, ``optimizer_dtype``;
        sim.model.memory.optimizer_bytes_per_param): 12 in mixed precision, 4 in pure bf16."""
        t = self.scenario.training
        return optimizer_bytes_per_param(self.dtype, t.master_weights, t.optimizer_dtype)

    @cached_property
    def optimizer_step_bytes_per_param(self) -> float:
        """HBM bytes the Adam step moves per trained parameter (sim.model.memory.adam_step_bytes_per_param): 28
        in mixed precision with 16-bit gradients, 30 with fp32 ones, 14 in pure bf16."""
        t = self.scenario.training
        return adam_step_bytes_per_param(self.dtype, self.grad_storage_bytes_per_param, t.master_weights,
                                         t.optimizer_dtype)

    @cached_property
    def main_grad_buffer(self) -> bool:
        """Megatron-LM keeps wider-than-the-weights (fp32) gradients in one contiguous buffer its DP buckets
        view (param_and_grad_buffer.py), so they need no second copy as communication buffers."""
        return self.grad_bytes_per_param > self.elem_bytes

    # ------------------------------------------------------------------------------------------- message bytes
    @cached_property
    def tp_bytes(self) -> float:
        """Bytes of one Megatron TP collective: the b x s x h activations of a block (Narayanan et al. SC21)."""
        return float(self.micro_batch * self.local_seq_len * self.model.hidden_size * self.elem_bytes)

    @cached_property
    def p2p_bytes(self) -> float:
        """Bytes one rank sends per pipeline boundary and micro-batch: b x s x h / t (Megatron scatters the
        p2p tensor over the TP group and gathers it after the send)."""
        return self.tp_bytes / self.tp

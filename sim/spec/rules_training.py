"""The scenario rules of the training section: the batch, recomputation, activation offload, sequence
length, the fine-tuning method and the inputs' documents agree with the layout and the model.

In: a ``Scenario`` and its ``Degrees`` (``sim.spec.degrees``). Out: nothing, or a ``ValueError`` whose one line names
the field (``training.global_batch: 10 is not a multiple of dp*micro_batch = ...``); the method's and the sequence
section's own rules are ``sim.spec.method.check_method`` and ``sim.spec.sequence.check_sequence``.
``sim.spec.rules`` runs them in its order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.spec.degrees import Degrees
from sim.spec.method import check_method
from sim.spec.sequence import check_sequence

if TYPE_CHECKING:
    from sim.spec.scenario import Scenario


def batch(s: Scenario, d: Degrees) -> None:
    t = s.training
    if t.global_batch is None and t.microbatches is None:
        raise ValueError("training: give global_batch (sequences per step) or microbatches (per pipeline)")
    if t.global_batch is not None and t.global_batch % (d.dp * t.micro_batch):
        raise ValueError(
            f"training.global_batch: {t.global_batch} is not a multiple of dp*micro_batch = "
            f"{d.dp}*{t.micro_batch} = {d.dp * t.micro_batch}"
        )
    # Both given: they must describe the same step (global_batch = microbatches * dp * micro_batch). Degrees takes
    # global_batch as given, so compare with the product, not with d.global_batch (which is the same field).
    if t.global_batch is not None and t.microbatches is not None and \
            t.global_batch != t.microbatches * d.dp * t.micro_batch:
        raise ValueError(f"training.microbatches: {t.microbatches} disagrees with global_batch {t.global_batch}: "
                         f"global_batch = microbatches*dp*micro_batch needs microbatches = "
                         f"{t.global_batch // (d.dp * t.micro_batch)}")


def recompute_layers(s: Scenario, d: Degrees) -> None:
    t = s.training
    if t.recompute_num_layers is not None:
        if t.recompute != "full":
            raise ValueError(f"training.recompute_num_layers: needs recompute: full (got {t.recompute})")
        if t.recompute_num_layers > d.layers_per_chunk:
            raise ValueError(f"training.recompute_num_layers: {t.recompute_num_layers} exceeds the "
                             f"{d.layers_per_chunk} layers of a model chunk")


def check_recompute_modules(s: Scenario) -> None:
    """``training.recompute_modules``: Megatron-Core's rules (transformer_config.py __post_init__): mla_up_proj needs
    multi-head latent attention; and, where Megatron would silently do nothing, a module the model does not have is
    refused instead (moe, moe_act, shared_experts on a model without one). As in Megatron, the list is read only
    under selective recomputation (none and full ignore it, so a search over recompute modes keeps one base)."""
    t, m = s.training, s.model
    if t.recompute_modules is None:
        return
    for module in t.recompute_modules:
        if module == "mla_up_proj" and not m.multi_latent_attention:
            raise ValueError("training.recompute_modules: mla_up_proj needs multi-head latent attention "
                             "(model.multi_latent_attention)")
        if module in ("moe", "moe_act") and not m.is_moe:
            raise ValueError(f"training.recompute_modules: {module} needs a MoE model (model.num_moe_experts is "
                             "not set)")
        if module == "shared_experts" and not m.moe_shared_expert_intermediate_size:
            raise ValueError("training.recompute_modules: shared_experts needs a shared expert "
                             "(model.moe_shared_expert_intermediate_size is not set)")
        if module == "mlp" and m.is_moe and all(m.moe_layers):
            raise ValueError("training.recompute_modules: mlp recomputes dense MLPs and every layer is a MoE "
                             "layer (use moe or moe_act)")


def offload_layers(s: Scenario, d: Degrees) -> None:
    t = s.training
    if t.cpu_offloading_num_layers:
        # Megatron-Core TransformerConfig: "CPU offloading can be done only for layers less than num_layers" and
        # "CPU offloading does not work when activation recomputation is enabled".
        if s.parallel.pp > 1:  # TransformerConfig: "Currently there is no support for Pipeline parallelism with
            # CPU offloading" (1e05700595 and d98e8a64dd); Megatron-LM's fine-grained offloading has no such check
            raise ValueError(f"training.cpu_offloading_num_layers: Megatron-Core offloads activations only without "
                             f"pipeline parallelism (parallel.pp = {s.parallel.pp}; it refuses "
                             "--cpu-offloading-num-layers with --pipeline-model-parallel-size > 1)")
        if t.recompute != "none":
            raise ValueError(f"training.cpu_offloading_num_layers: activation offload needs recompute: none (got "
                             f"{t.recompute}), as Megatron-Core refuses both together")
        if t.cpu_offloading_num_layers >= min(d.chunk_sizes):
            raise ValueError(f"training.cpu_offloading_num_layers: {t.cpu_offloading_num_layers} must be below the "
                             f"{min(d.chunk_sizes)} layers of a model chunk (the last layer's backward starts at once)")


def seq_len(s: Scenario, d: Degrees) -> None:
    m = s.model
    if m.position_embedding == "learned" and d.seq_len > m.max_seq_len:
        raise ValueError(f"training.seq_len: {d.seq_len} exceeds model.max_seq_len = {m.max_seq_len}")


def method(s: Scenario, d: Degrees) -> None:
    check_method(s)


def sequence(s: Scenario, d: Degrees) -> None:
    check_sequence(s.training.sequence, d.seq_len)

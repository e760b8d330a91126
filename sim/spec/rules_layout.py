"""The scenario rules of the parallel layout: the degrees fill the cluster and divide the model, the pipeline
split and the schedule fit, and TP's chunks, sequence and context parallelism fit the sequence.

In: a ``Scenario`` and its ``Degrees`` (``sim.spec.degrees``). Out: nothing, or a ``ValueError`` whose one line names
the field (``parallel: tp*pp*dp = 96 but the cluster has 64 GPUs``). ``sim.spec.rules`` runs them in its order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.parallel.context import check_context
from sim.parallel.schedules import SCHEDULES
from sim.spec.degrees import Degrees, pipeline_slots

if TYPE_CHECKING:
    from sim.spec.scenario import Scenario


def gpus(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    gpus = d.num_gpus
    split, name = p.tp * p.cp * p.pp, "tp*pp" if p.cp == 1 else "tp*cp*pp"
    if p.dp is None and gpus % split:
        raise ValueError(f"parallel: {name} = {split} does not divide the cluster's {gpus} GPUs")
    if split * d.dp != gpus:
        raise ValueError(f"parallel: {name}*dp = {split * d.dp} but the cluster has {gpus} GPUs")


def pipeline_split(s: Scenario, d: Degrees) -> None:
    p, m = s.parallel, s.model
    uneven = p.first_stage_layers is not None or p.last_stage_layers is not None
    slots = pipeline_slots(s)
    if uneven:
        _check_uneven_stages(s)
    elif slots:
        _check_split_slots(s, slots)
    elif m.num_layers % (p.pp * p.vpp):
        what = "pp" if p.vpp == 1 else "pp*vpp"
        raise ValueError(f"parallel.{what}: {p.pp * p.vpp} does not divide model.num_layers = {m.num_layers}")


def tp_divides(s: Scenario, d: Degrees) -> None:
    p, m = s.parallel, s.model
    if m.num_attention_heads % p.tp:
        raise ValueError(f"parallel.tp: {p.tp} does not divide model.num_attention_heads = {m.num_attention_heads}")
    if m.kv_heads % p.tp:
        raise ValueError(f"parallel.tp: {p.tp} does not divide model.num_kv_heads = {m.kv_heads}")
    if m.ffn % p.tp:
        raise ValueError(f"parallel.tp: {p.tp} does not divide model.ffn_hidden_size = {m.ffn}")


def async_tp_chunks(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    if p.tp_comm_overlap_method == "async_tp" and p.tp_comm_overlap_chunks not in (None, 1, p.tp):
        # torch/distributed/_symmetric_memory: one chunk per rank of the group (1: the ablation, not split)
        raise ValueError(f"parallel.tp_comm_overlap_chunks: {p.tp_comm_overlap_chunks} under async_tp, whose "
                         f"collectives move one chunk per TP rank: leave it unset (tp = {p.tp}) or 1 (not split)")


def sequence_parallel(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    if p.sequence_parallel and d.seq_len % p.tp:
        raise ValueError(f"parallel.sequence_parallel: seq_len {d.seq_len} is not a multiple of tp = {p.tp}")


def context(s: Scenario, d: Degrees) -> None:
    p, m, t = s.parallel, s.model, s.training
    check_context(p.cp, p.cp_comm_type, d.seq_len, p.tp, p.sequence_parallel, m.num_attention_heads, m.kv_heads,
                  flash_attention=t.flash_attention, sliding_window=m.window_size is not None,
                  latent_attention=m.multi_latent_attention)


def schedule(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    reason = SCHEDULES[s.schedule].invalid_reason(p.pp, d.microbatches, p.vpp)
    if reason:
        raise ValueError(f"schedule: {reason}")


def _check_uneven_stages(s: Scenario) -> None:
    p, layers = s.parallel, s.model.num_layers
    given_fields = [name for name in ("first_stage_layers", "last_stage_layers") if getattr(p, name) is not None]
    field = "parallel." + "/".join(given_fields)
    if p.pp < 2:
        raise ValueError(f"{field}: needs pp >= 2 (pp = {p.pp})")
    if p.account_for_embedding_in_pipeline_split or p.account_for_loss_in_pipeline_split:
        raise ValueError(f"{field}: not with parallel.account_for_embedding/loss_in_pipeline_split (Megatron-Core "
                         "refuses both at once)")
    given = (p.first_stage_layers is not None) + (p.last_stage_layers is not None)
    rest = layers - (p.first_stage_layers or 0) - (p.last_stage_layers or 0)
    others = p.pp - given
    if rest < others or (others and rest % others) or (not others and rest):
        raise ValueError(f"{field}: the other {others} stage(s) cannot split the remaining {rest} of "
                         f"model.num_layers = {layers} evenly")
    # With interleaving, each stage's layers split evenly over its vpp chunks (Megatron-Core transformer_config.py:
    # the first, the last and each middle stage's layers must be divisible by the virtual pipeline degree).
    _check_chunk_order(s, field)
    middle = rest // others if others else None
    for name, count in (("parallel.first_stage_layers", p.first_stage_layers),
                        ("parallel.last_stage_layers", p.last_stage_layers), (field, middle)):
        if count is not None and count % p.vpp:
            raise ValueError(f"{name}: a stage of {count} layers does not split over vpp = {p.vpp} model chunks "
                             "(Megatron-Core requires each stage's layers divisible by vpp)")


def _check_chunk_order(s: Scenario, field: str) -> None:
    """Uneven chunks are laid out in Megatron's interleaved order (chunk a * pp + b on stage b): not in the V or
    DualPipe layouts."""
    if s.parallel.vpp > 1 and SCHEDULES[s.schedule].layout != "interleaved":
        raise ValueError(f"{field}: uneven model chunks need the interleaved layout (schedule {s.schedule} places "
                         "its chunks otherwise)")


def _check_split_slots(s: Scenario, slots: int) -> None:
    """Megatron-Core's account_for_embedding/loss_in_pipeline_split: num_layers plus the slots the embedding and
    the loss take must split evenly over pp, and each stage's share over vpp (transformer_config.py)."""
    p, layers = s.parallel, s.model.num_layers
    if p.pp < 2:
        raise ValueError(f"parallel.account_for_embedding_in_pipeline_split: needs pp >= 2 (pp = {p.pp})")
    _check_chunk_order(s, "parallel.account_for_embedding_in_pipeline_split")
    total = layers + slots
    if total % (p.pp * p.vpp):
        raise ValueError(f"parallel.account_for_embedding_in_pipeline_split: model.num_layers + {slots} = {total} "
                         f"does not split evenly over pp*vpp = {p.pp * p.vpp} model chunks")
    if total == p.pp:
        # one slot per stage: the first stage holds the embedding alone (and the last the loss). Megatron-Core can
        # build such a stage; the simulator keeps a stage's head and embedding gradients with its layers, so it
        # refuses the layout rather than drop them
        raise ValueError(f"parallel.account_for_embedding_in_pipeline_split: model.num_layers + {slots} = {total} "
                         f"over pp = {p.pp} stages leaves the embedding's or the loss's stage without a transformer "
                         "layer, which is not modelled")

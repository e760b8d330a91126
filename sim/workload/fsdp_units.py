"""FSDP / ZeRO-3 units: the parameters each gathers and reduces, and FSDP1's gradient kernels.

In: a ``Plan`` (``unit_layers``, the model, tp, fine-tuning's trained and frozen parameters, a DeepSpeed block's
persistence threshold and bucket sizes, ``fsdp.version``) and a unit, model chunk or block's ops. Out: a unit's
parameters per TP rank, those with gradients and its gathered weights (``unit_params``, ``unit_grad_params``,
``unit_weight_params``), its leaf modules' tensors (``unit_modules``), the units of a model chunk under FSDP + PP
(``ChunkUnit``, ``chunk_units``; docs/mechanisms/fsdp_pipeline.md), the all-gathers that bring a unit
(``gather_calls``), the reduce-scatters of one micro-batch's backward (``reduce_buckets``), and FSDP1's
gradient flatten / cast / pre-divide kernels (``fsdp_grad_ops``, ``fsdp_predivide_factor``;
docs/mechanisms/fsdp_grad_kernels.md). The data-parallel emitter and the estimate read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.model.ops import Op
from sim.model.params import embedding_params, head_params, layer_modules
from sim.plan import Plan


def fsdp_predivide_factor(world_size: int) -> int:
    """FSDP1's gradient pre-division factor: the largest power of two f dividing ``world_size`` with
    world_size / f > f, doubling from 1 (torch/distributed/algorithms/_comm_hooks/default_hooks.py
    DefaultState._get_gradient_predivide_factor; FSDP divides by f before the reduce-scatter, by world_size / f
    after it)."""
    factor = 1
    while world_size % factor == 0 and world_size / factor > factor:
        factor *= 2
    return factor


def fsdp_grad_ops(plan: Plan, block_ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """FSDP1's gradient kernels for a block's trainable weights, per micro-batch, in the backward
    (docs/mechanisms/fsdp_grad_kernels.md). Under ``torch.distributed.fsdp.FullyShardedDataParallel`` a unit's
    parameters are views into its flat parameter (``_flat_param.py`` ``_get_unflat_views_unaligned``:
    ``torch.split`` + ``view``), so autograd concatenates their gradients into the flat gradient
    (split_with_sizes' backward, a copy: read and write the gradient); the post-backward hook then casts the flat
    gradient to the reduce dtype where it differs (``_runtime_utils.py`` ``_post_backward_hook``:
    ``flat_param.grad.to(handle._reduce_dtype)``) and divides it in place by the pre-division factor before the
    reduce-scatter (``_reduce_grad``: ``_div_if_needed``). Each is a memory-bound pass over every gradient element
    of the unit; the hook's two run on FSDP's post-backward stream, beside the next unit's backward, and share its
    HBM: priced on the compute stream. None under FSDP2 (``fsdp.version: 2``), without FSDP, and where FSDP
    reduces once per step under pipeline parallelism (``Plan.pipelined_fsdp``)."""
    fsdp = plan.scenario.fsdp
    if fsdp is None or fsdp.version != 1 or plan.pipelined_fsdp or plan.dp <= 1:
        return ()
    weights = sum(op.shape[0] * op.shape[2] * op.shape[3] for op in block_ops
                  if op.has_weights and op.trainable and op.shape is not None)
    if not weights:
        return ()
    grad, reduce = plan.elem_bytes, plan.grad_bytes_per_param  # autograd's gradient dtype, FSDP's reduce dtype
    ops = [Op("fsdp_grad_flatten", 0.0, weights * 2.0 * grad, False, runs_in="weight_grad")]
    if reduce != grad:
        ops.append(Op("fsdp_grad_cast", 0.0, weights * (grad + reduce), False, runs_in="weight_grad"))
    # The factor of the whole data-parallel world (HYBRID_SHARD: shard x replica groups, _init_utils.py).
    if fsdp_predivide_factor(len(plan.grid.dp_group(0))) > 1:
        ops.append(Op("fsdp_grad_predivide", 0.0, weights * 2.0 * reduce, False, runs_in="weight_grad"))
    return tuple(ops)


def unit_params(plan: Plan, unit: int) -> float:
    """Parameters (per TP rank) of FSDP / ZeRO-3 unit ``unit`` (``plan.unit_layers`` layers), with the embedding
    in the first unit and the head in the last."""
    layers = plan.unit_layers
    params = layers * plan.dense_layer_params
    first, last = unit * layers, (unit + 1) * layers - 1
    if first == 0:
        params += embedding_params(plan.model) / plan.tp
    if last == plan.model.num_layers - 1:
        params += head_params(plan.model) / plan.tp
    return params


def unit_grad_params(plan: Plan, unit: int) -> float:
    """Parameters of unit ``unit`` that get gradients, per TP rank (what its reduce-scatter carries):
    ``unit_params`` in full training, the trainable ones under a fine-tuning method (sim.model.peft)."""
    if not plan.peft.active:
        return unit_params(plan, unit)
    layers = range(unit * plan.unit_layers, (unit + 1) * plan.unit_layers)
    params = sum(plan.layer_grad_params(layer) for layer in layers)
    if layers[0] == 0:
        params += embedding_params(plan.model) * plan.embedding_trains / plan.tp
    if layers[-1] == plan.model.num_layers - 1:
        params += head_params(plan.model) * plan.head_trains / plan.tp
    return params


def unit_weight_params(plan: Plan, unit: int) -> float:
    """Unit ``unit``'s gathered weights in compute-dtype parameters (bytes / ``plan.weight_bytes_per_param``):
    ``unit_params`` in full training; frozen weights count at their storage size (an NF4 weight ~0.26)."""
    if not plan.peft.active:
        return unit_params(plan, unit)
    layers = range(unit * plan.unit_layers, (unit + 1) * plan.unit_layers)
    params = sum(plan.layer_weight_bytes(layer) for layer in layers) / plan.weight_bytes_per_param
    if layers[0] == 0:
        params += embedding_params(plan.model) / plan.tp
    if layers[-1] == plan.model.num_layers - 1:
        params += head_params(plan.model) / plan.tp
    return params


@dataclass(frozen=True)
class ChunkUnit:
    """An FSDP unit as FSDP + PP places it (``Plan.pipelined_fsdp``): its first layer (-1: a chunk holding only
    the embedding or the head), and the parameters per TP rank its all-gather carries (compute-dtype
    equivalents, ``unit_weight_params``) and its reduce-scatter carries (``unit_grad_params``)."""

    layer: int
    weight_params: float
    grad_params: float


def chunk_units(plan: Plan, chunk: int) -> list[ChunkUnit]:
    """The FSDP units of model ``chunk`` in forward order: ``plan.unit_layers`` of its layers each, the embedding
    in the first unit of chunk 0 and the head in the last unit of the last chunk (their own unit where that
    chunk holds no transformer layer: Megatron-Core's account_for_embedding/loss_in_pipeline_split with one layer
    per chunk, as Llama 3's pipeline). Unlike ``unit_params``, the embedding and head go where their chunk is."""
    model, tp = plan.model, plan.tp
    embedding = embedding_params(model) / tp if chunk == 0 else 0.0
    head = head_params(model) / tp if chunk == plan.chunks - 1 else 0.0
    layers = plan.chunk_layers(chunk)
    if not layers:
        return [ChunkUnit(-1, embedding + head, embedding * plan.embedding_trains + head * plan.head_trains)]
    units = []
    for first in layers[::plan.unit_layers]:
        unit = first // plan.unit_layers
        weights, grads = unit_weight_params(plan, unit), unit_grad_params(plan, unit)
        if first == 0 and chunk != 0:  # the embedding is on chunk 0, which holds no layer
            weights, grads = weights - embedding_params(model) / tp, grads - embedding_params(model) / tp \
                * plan.embedding_trains
        if first + plan.unit_layers == model.num_layers and chunk != plan.chunks - 1:  # the head: the last chunk
            weights, grads = weights - head_params(model) / tp, grads - head_params(model) / tp * plan.head_trains
        units.append(ChunkUnit(first, weights, grads))
    return units


def unit_modules(plan: Plan, unit: int) -> list[tuple[float, ...]]:
    """The parameter tensors (elements per TP rank) of unit ``unit``'s leaf modules, module by module in forward
    order: the embedding in the first unit, each layer's modules (sim.model.params.layer_modules), the final
    norm and LM head in the last. They sum to ``unit_params``."""
    model, tp, layers = plan.model, plan.tp, plan.unit_layers
    first, last = unit * layers, (unit + 1) * layers - 1
    modules: list[tuple[float, ...]] = []
    if first == 0:
        modules.append((embedding_params(model) / tp,))
    modules += [module.tensors for _ in range(layers) for module in layer_modules(model, tp)]
    if last == model.num_layers - 1:
        modules.append((head_params(model) / tp,))
    return modules


def gather_calls(plan: Plan, unit: int) -> tuple[float, ...]:
    """Parameters (per TP rank) of each all-gather that brings unit ``unit``'s weights, in issue order.

    FSDP (and ``parallel.zero: 3`` without a DeepSpeed block): one all-gather of the unit's flat parameter.
    DeepSpeed ZeRO-3 (``plan.deepspeed``): per leaf module, leaving out the parameters of at most
    ``stage3_param_persistence_threshold`` elements (kept whole on every rank), consecutive modules coalesced into
    one all-gather until it holds ``stage3_prefetch_bucket_size`` elements, as the prefetcher fills its bucket
    (partitioned_param_coordinator.py fetch_sub_module; a module is never split, and a bucket of 0 fetches module
    by module). Buckets do not run across units here (DeepSpeed's prefetch queue does)."""
    ds = plan.deepspeed
    if ds is None:
        return (unit_weight_params(plan, unit),)
    calls, pending = [], 0.0
    for tensors in unit_modules(plan, unit):
        gathered = sum(n for n in tensors if n > ds.stage3_param_persistence_threshold)
        if gathered <= 0:
            continue
        pending += gathered
        if pending >= ds.stage3_prefetch_bucket_size:
            calls.append(pending)
            pending = 0.0
    if pending > 0:
        calls.append(pending)
    return tuple(calls)


def reduce_buckets(plan: Plan) -> list[tuple[int, float]]:
    """The gradient reduce-scatters of one micro-batch's backward under ZeRO-3 / FSDP, in issue order: (the layer
    whose backward issues it, parameters per TP rank). FSDP: one per unit, after its first layer's backward.
    DeepSpeed ZeRO-3: gradients join a bucket module by module as the backward produces them (reverse forward
    order), and the bucket is reduced when the next module's gradients would take it past ``reduce_bucket_size``
    elements (stage3.py reduce_independent_p_g_buckets_and_remove_grads: ``elements_in_ipg_bucket + numel >
    reduce_bucket_size``); the rest after the last layer (with the embedding's). Issued at the end of the layer
    whose module overflowed the bucket (the emitters run a layer's backward as one piece)."""
    units = plan.model.num_layers // plan.unit_layers
    ds = plan.deepspeed
    if ds is None:
        return [(unit * plan.unit_layers, unit_grad_params(plan, unit)) for unit in reversed(range(units))]
    buckets, pending = [], 0.0
    for unit in reversed(range(units)):
        for tensors in reversed(unit_modules(plan, unit)):
            numel = sum(tensors)
            if pending > 0 and pending + numel > ds.reduce_bucket_size:
                buckets.append((unit * plan.unit_layers, pending))
                pending = 0.0
            pending += numel
    buckets.append((0, pending))
    return buckets

"""The scenario rules of a MoE model's expert parallelism: Megatron-Core's rules for MoE parallel folding,
the token dispatcher's (DeepEP's peer limits), and the combined 1F1B's conditions (``moe.a2a_overlap``).

In: a ``Scenario`` and its ``Degrees`` (``sim.spec.degrees``: ep, etp and the folded degrees). Out: nothing, or a
``ValueError`` whose one line names the field (``parallel.ep: 3 does not divide model.num_moe_experts = 8``); a
dense model with MoE settings is refused too. ``sim.spec.rules`` runs ``check_experts`` in its order.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from sim.network import deepep
from sim.parallel.grid import RankGrid
from sim.parallel.schedules import A2A_OVERLAP
from sim.spec.degrees import Degrees

if TYPE_CHECKING:
    from sim.spec.moe import MoeSpec
    from sim.spec.scenario import Scenario


@functools.cache
def _default_moe(spec: type[MoeSpec]) -> MoeSpec:
    """The default ``moe`` section, built once (the search checks the rules of thousands of layouts)."""
    return spec()


def check_experts(s: Scenario, d: Degrees) -> None:
    """Expert parallelism (Megatron-Core's rules for MoE parallel folding, megatron/core/parallel_state.py and
    transformer_config.py), each naming its field; ``d``: the scenario's degrees."""
    p, m, moe = s.parallel, s.model, s.moe
    if not m.is_moe:
        if s.moe != _default_moe(type(s.moe)):
            raise ValueError("moe: the token-dispatch settings need a MoE model (model.num_moe_experts is not set)")
        if p.ep > 1 or (p.etp is not None and p.etp > 1):
            field = "ep" if p.ep > 1 else "etp"
            raise ValueError(f"parallel.{field}: expert parallelism needs a MoE model (model.num_moe_experts is "
                             "not set)")
        return
    experts = m.num_moe_experts or 0
    if experts % p.ep:
        raise ValueError(f"parallel.ep: {p.ep} does not divide model.num_moe_experts = {experts}")
    if m.moe_ffn % d.etp:
        raise ValueError(f"parallel.etp: {d.etp} does not divide the expert FFN size {m.moe_ffn}")
    if (d.tp * d.cp * d.dp) % (d.ep * d.etp):
        folded = "tp*dp" if d.cp == 1 else "tp*cp*dp"
        raise ValueError(f"parallel.ep: ep*etp = {d.ep * d.etp} does not divide {folded} = {d.tp * d.cp * d.dp} (the "
                         f"ranks of a pipeline stage the experts are folded over)")
    if p.tp > 1 and not p.sequence_parallel:
        raise ValueError(f"parallel.sequence_parallel: a MoE model with tp = {p.tp} needs sequence parallelism "
                         "(Megatron-Core requires it with expert layers)")
    if d.zero_stage >= 2 or s.fsdp is not None:
        raise ValueError(f"parallel.zero: ZeRO-{d.zero_stage}/FSDP with a MoE model is not modelled; use ZeRO-0 or "
                         "ZeRO-1 (Megatron's distributed optimizer)")
    if moe.pad_to_capacity and moe.capacity_factor is None:
        raise ValueError("moe.pad_to_capacity: padding to capacity needs moe.capacity_factor")
    if moe.force_load_balancing and moe.imbalance != 1.0:
        raise ValueError(f"moe.imbalance: {moe.imbalance:g} cannot be combined with moe.force_load_balancing (the "
                         "random router's imbalance is derived from the tokens, top-k, experts and ep); set one")
    if moe.token_dispatcher == "flex" and d.etp > 1:
        raise ValueError(f"moe.token_dispatcher: flex (DeepEP) with parallel.etp = {d.etp} is not modelled; use "
                         "etp 1 or the alltoall dispatcher")
    if moe.token_dispatcher == "flex" and d.ep > 1:  # DeepEP V1's peer limits (docs/mechanisms/deepep.md)
        grid = RankGrid(d.tp, d.pp, d.dp, s.cluster.gpus_per_node, d.ep, d.etp, d.cp)
        why = deepep.beyond_peer_limits(*deepep.ep_group_shape(grid.ep_group(0), s.cluster.nvlink_domain))
        if why:
            raise ValueError(f"moe.token_dispatcher: flex (DeepEP): {why}; use the alltoall dispatcher or another "
                             "layout")
    if moe.a2a_overlap:
        check_a2a_overlap(s, d)
    if len(m.moe_layers) != m.num_layers:
        raise ValueError(f"model.moe_layer_freq: {len(m.moe_layers)} entries but model.num_layers = {m.num_layers}")


def check_a2a_overlap(s: Scenario, d: Degrees) -> None:
    """``moe.a2a_overlap`` (--overlap-moe-expert-parallel-comm): Megatron-Core's conditions (transformer_config.py
    __post_init__), each naming its field."""
    t = s.training
    if d.ep == 1:
        raise ValueError("moe.a2a_overlap: needs expert parallelism (parallel.ep > 1)")
    if s.moe.token_dispatcher not in ("alltoall", "flex"):
        raise ValueError(f"moe.a2a_overlap: needs the alltoall or flex token dispatcher, not "
                         f"{s.moe.token_dispatcher}")
    if s.parallel.pp > 1 and s.schedule != "interleaved":
        raise ValueError(f"schedule: moe.a2a_overlap with pp = {s.parallel.pp} runs in Megatron-Core's interleaved "
                         f"schedule (virtual pipeline size given), not {s.schedule}")
    if s.parallel.pp > 1 and s.parallel.vpp < 2:
        # transformer_config.py __post_init__: "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size
        # must be specified when pipeline_model_parallel_size > 1"; arguments.py sets a virtual size of 1 to None.
        # The combined 1F1B exists only without pipelining and interleaved (combined_1f1b.py).
        raise ValueError(f"parallel.vpp: moe.a2a_overlap with pp = {s.parallel.pp} needs virtual pipeline stages "
                         f"(vpp >= 2, not {s.parallel.vpp}; Megatron-Core asserts a virtual pipeline size when pp > "
                         "1)")
    if s.parallel.pp == 1 and s.schedule not in A2A_OVERLAP:
        raise ValueError(f"schedule: moe.a2a_overlap with pp = 1 is Megatron-Core's no-pipelining combined 1F1B, not "
                         f"{s.schedule}")
    if t.recompute == "full":
        raise ValueError("training.recompute: full recomputation cannot run with moe.a2a_overlap (Megatron-Core "
                         "requires it off)")
    if t.recompute == "selective" and "moe" in (t.recompute_modules or ()):
        raise ValueError("training.recompute_modules: module moe cannot be recomputed with moe.a2a_overlap "
                         "(Megatron-Core requires it off)")
    if t.dtype not in ("bf16", "fp16", "fp8"):
        raise ValueError(f"training.dtype: moe.a2a_overlap needs a bf16 or fp16 model, not {t.dtype}")
    if s.parallel.cuda_device_max_connections == 1:
        # Megatron-Core's MoE README: "Requirements for EP A2A Overlap: ... CUDA_DEVICE_MAX_CONNECTIONS > 1"; at 1
        # the pair's kernels launch in issue order across streams and the overlap breaks up (Megatron-LM #2730)
        raise ValueError("parallel.cuda_device_max_connections: moe.a2a_overlap needs more than 1 hardware queue "
                         "(Megatron-Core's requirement; at 1 kernels launch in issue order, which is not modelled)")

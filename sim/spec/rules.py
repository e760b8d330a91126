"""Cross-field rules of a scenario: the checks no single field's type can express.

In: a ``Scenario`` whose fields each passed pydantic validation. Out: nothing, or a ``ValueError`` whose one-line
message starts with the field(s) it concerns and states the rule (``parallel: tp*pp*dp = 96 but the cluster has
64 GPUs``); ``sim.spec.scenario`` turns it into the CLI's error line.

This module holds the rules' order (``RULES``: the first that fails is the one reported), the fields each reads
(``Rule.reads``) and ``check_rules``; the checks live by concern, one module each: the parallel layout
(``sim.spec.rules_layout``), the training section (``sim.spec.rules_training``), sharding, FSDP, DeepSpeed and CPU
offload (``sim.spec.rules_sharding``), expert parallelism (``sim.spec.rules_moe``) and what the cluster must offer
(``sim.spec.rules_cluster``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from sim.spec import rules_cluster as cluster
from sim.spec import rules_layout as layout
from sim.spec import rules_moe as moe
from sim.spec import rules_sharding as sharding
from sim.spec import rules_training as training
from sim.spec.degrees import Degrees, degrees

if TYPE_CHECKING:
    from sim.spec.scenario import Scenario


class Rule(NamedTuple):
    """One cross-field rule: ``check(s, d)`` raises its one-line ValueError or returns; ``reads`` names the scenario
    fields (dotted paths; a section's name stands for all its fields) it reads, those behind the degrees it reads
    included, wherever a caller may vary them: a caller that checks many scenarios differing in a few fields (the
    search's layouts) runs a rule once per distinct value of the fields it reads (``sim.explore.layout_table``).
    The model, cluster and other fields no search varies are read freely."""

    reads: tuple[str, ...]
    check: Callable[[Scenario, Degrees], None]


# What the degrees' fields are read from (sim.spec.degrees): the data-parallel degree, the micro-batches, the chunks
_DP = ("parallel.tp", "parallel.cp", "parallel.pp", "parallel.dp")
_MICROBATCHES = (*_DP, "training.micro_batch", "training.microbatches", "training.global_batch")
_CHUNKS = ("parallel.pp", "parallel.vpp", "parallel.first_stage_layers", "parallel.last_stage_layers",
           "parallel.account_for_embedding_in_pipeline_split", "parallel.account_for_loss_in_pipeline_split")
_ZERO = ("parallel.zero", "fsdp")
_SEQ_LEN = ("training.seq_len",)


def check_rules(s: Scenario) -> Degrees:
    """Cross-field rules (``RULES``, in this order: the first that fails is the one reported); each message starts
    with the field(s) it concerns. Returns the degrees it checked (``degrees(s)``), for a caller that resolves the
    scenario next (the search's candidates)."""
    d = degrees(s)
    for rule in RULES:
        rule.check(s, d)
    return d


# The rules in the order check_rules runs them, each with the fields it reads (``Rule.reads``).
RULES: tuple[Rule, ...] = (
    Rule(_DP, layout.gpus),
    Rule((*_CHUNKS, "schedule"), layout.pipeline_split),
    Rule(("parallel.tp",), layout.tp_divides),
    Rule(("parallel.tp_comm_overlap_method", "parallel.tp_comm_overlap_chunks", "parallel.tp"), layout.async_tp_chunks),
    Rule(("fsdp", "deepspeed"), sharding.one_sharding),
    Rule(_MICROBATCHES, training.batch),
    Rule((*_CHUNKS, "training.recompute", "training.recompute_num_layers"), training.recompute_layers),
    Rule(("training.recompute_modules",), lambda s, d: training.check_recompute_modules(s)),
    Rule((*_CHUNKS, "training.recompute", "training.cpu_offloading_num_layers"), training.offload_layers),
    Rule(_SEQ_LEN, training.seq_len),
    Rule(("parallel.sequence_parallel", "parallel.tp", *_SEQ_LEN), layout.sequence_parallel),
    Rule(("training.dtype",), cluster.dtype),
    Rule(("fsdp", "parallel.pp"), sharding.reshard),
    Rule(_ZERO, sharding.fsdp_zero),
    Rule((*_ZERO, "parallel.pp"), sharding.deepspeed_pipeline),
    Rule(("fsdp", *_CHUNKS), sharding.unit_per_stage),
    Rule((*_ZERO, "schedule"), sharding.sharded_split_backward),
    Rule(("fsdp",), sharding.unit_layers),
    Rule(("fsdp", *_DP), sharding.hybrid_shard),
    # check_method reads the training method's fields, the dtype and (under a DeepSpeed block) parallel.zero
    Rule(("training.method", "training.frozen_layers", "training.frozen_embedding", "training.lora",
          "training.qlora", "training.dtype", "deepspeed", "parallel.zero"), training.method),
    Rule(("training.sequence", *_SEQ_LEN), training.sequence),
    Rule(("network",), lambda s, d: cluster.check_sm_contention(s)),
    Rule(("parallel.ep", "parallel.etp", "parallel.sequence_parallel", "parallel.vpp", "training.recompute",
          "training.recompute_modules", "training.dtype", "schedule", "moe", "parallel.cuda_device_max_connections",
          *_ZERO, *_DP), moe.check_experts),
    Rule(("parallel.cp", "parallel.cp_comm_type", "parallel.tp", "parallel.sequence_parallel",
          "training.flash_attention", *_SEQ_LEN), layout.context),
    Rule(("variation", "ranks", "network"), cluster.variation),
    Rule(("schedule", "parallel.vpp", *_MICROBATCHES), layout.schedule),
    Rule(("offload", "parallel.overlap_param_gather", "training.master_weights", "training.dtype",
          "training.optimizer_dtype", *_ZERO, *_DP), sharding.offload),
    Rule(("costs", "training.dtype"), cluster.calibrated),
)

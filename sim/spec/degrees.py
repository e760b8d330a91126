"""The degrees and batch a scenario's knobs imply, computed once for the rules and the plan.

In: a ``Scenario``'s fields (schema only: the scenario carries no derived properties). Out: ``Degrees``, a frozen
record of the data-parallel degree (``parallel.dp`` or the GPUs left by tp x cp x pp), the micro-batches per
pipeline and the global batch (each from the other), the sequence length (default: ``DEFAULT_SEQ_LEN``, at most the
model's maximum), the ZeRO stage (``parallel.zero`` or FSDP's sharding strategy), the layers of the largest model
chunk, and the expert degrees of a MoE model (ep, etp, and edp = tp*cp*dp/(ep*etp): Megatron-Core's MoE parallel
folding, experts folded over the tp x cp x dp ranks of a stage), and the context-parallel degree cp. The cross-field
rules (sim.spec.rules) check them; the plan (sim.plan) exposes them to everything below the configuration
layer. Modelled on TorchTitan's ``ParallelDims``: degrees decided once, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.parallel.grid import chunk_sizes

if TYPE_CHECKING:
    from sim.spec.scenario import Scenario


# training.seq_len when a scenario leaves it out. Megatron-LM has no default (--seq-length is required) and a
# model's max_position_embeddings is its longest context, not what it trains at (131,072 for Llama 3.1, whose
# pre-training ran at 8,192: Dubey et al. 2024 Sec. 3.4.1), so the default is a stated length, capped at the
# model's maximum: 8,192, Llama 3's pre-training length and the longest of the presets whose max_seq_len is their
# pre-training length (GPT-3 2,048, Llama 2 4,096, Llama 3 8,192 keep theirs). ``sim check`` notes it.
DEFAULT_SEQ_LEN = 8192


def default_seq_len(max_seq_len: int) -> int:
    """The sequence length a scenario without ``training.seq_len`` trains at (see DEFAULT_SEQ_LEN)."""
    return min(DEFAULT_SEQ_LEN, max_seq_len)


@dataclass(frozen=True)
class Degrees:
    num_gpus: int
    tp: int
    pp: int
    dp: int
    vpp: int
    micro_batch: int
    microbatches: int  # per pipeline and step
    global_batch: int  # sequences per step
    seq_len: int
    zero_stage: int
    chunk_sizes: tuple[int, ...]  # layers of each of the pp*vpp model chunks, in model order
    # MoE parallel folding (Megatron-Core): a stage's tp x dp ranks re-split as etp x ep x edp for the experts.
    ep: int = 1
    etp: int = 1
    edp: int = 1  # expert data parallel: tp*cp*dp / (ep*etp), the ranks holding the same experts
    cp: int = 1  # context parallel: each sequence split over cp ranks (Megatron --context-parallel-size)

    @property
    def layers_per_chunk(self) -> int:
        """Layers of the largest model chunk (of every chunk unless first/last_stage_layers are set)."""
        return max(self.chunk_sizes, default=0)


def pipeline_slots(scenario: Scenario) -> int:
    """Layer slots the embedding and the loss take in the pipeline split (0-2: Megatron-Core's
    --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split)."""
    p = scenario.parallel
    return int(p.account_for_embedding_in_pipeline_split) + int(p.account_for_loss_in_pipeline_split)


def degrees(scenario: Scenario) -> Degrees:
    """The degrees of a scenario whose fields passed validation (the rules then check they are consistent)."""
    p, t = scenario.parallel, scenario.training
    gpus = scenario.cluster.num_gpus
    dp = p.dp or max(1, gpus // (p.tp * p.cp * p.pp))  # 0 would divide by zero before the rules name tp*pp
    microbatches = t.microbatches or (t.global_batch or 0) // (dp * t.micro_batch)
    fsdp = scenario.fsdp
    etp = p.etp or p.tp
    return Degrees(
        num_gpus=gpus, tp=p.tp, pp=p.pp, dp=dp, vpp=p.vpp, micro_batch=t.micro_batch, microbatches=microbatches,
        global_batch=t.global_batch or microbatches * dp * t.micro_batch,
        seq_len=t.seq_len or default_seq_len(scenario.model.max_seq_len),
        zero_stage=fsdp.zero_stage if fsdp is not None else p.zero,
        # More pipeline slots than layers is refused by the rules; no chunk list is built for it (a fuzzed pp of 1e12
        # would otherwise allocate one entry per slot before the rule could say so).
        chunk_sizes=chunk_sizes(scenario.model.num_layers, p.pp, p.vpp, p.first_stage_layers, p.last_stage_layers,
                                p.account_for_embedding_in_pipeline_split, p.account_for_loss_in_pipeline_split)
        if p.pp * p.vpp <= scenario.model.num_layers + pipeline_slots(scenario) else (),
        ep=p.ep, etp=etp, edp=max(1, p.tp * p.cp * dp // (p.ep * etp)), cp=p.cp,
    )

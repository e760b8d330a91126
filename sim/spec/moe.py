"""The ``moe:`` section of a scenario: how a MoE model's tokens reach their experts.

In: the ``moe:`` mapping, by Megatron-Core's MoE flags: the token dispatcher (all-to-all, all-gather, DeepEP's
flex) with DeepEP's bandwidths and SMs, the experts' capacity, routing imbalance or forced load balancing, the
dispatcher's host sync, and the combined 1F1B's overlap of the exchanges. Out: a frozen ``MoeSpec``, read only
with a MoE model; the rules it must meet with the other sections (ep, the dispatcher ``a2a_overlap`` needs) are
``sim.spec.rules_moe``'.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sim.hardware.frozen import FrozenSpec
from sim.units import BytesPerSecond


class MoeSpec(FrozenSpec):
    """How a MoE model's tokens reach their experts (Megatron-Core's MoE knobs; used only with a MoE model)."""

    token_dispatcher: Literal["alltoall", "allgather", "flex"] = Field(default="alltoall", description=(
        "--moe-token-dispatcher-type: alltoall: tokens go to their experts' ranks by an all-to-all over the EP "
        "group (and come back by another); allgather: every rank all-gathers the tokens of the etp x ep group and "
        "reduce-scatters the outputs; flex: DeepEP's normal kernels (--moe-flex-dispatcher-backend deepep): a "
        "token sent once per destination node over RDMA and forwarded once per destination rank over NVLink "
        "(sim.network.deepep, docs/mechanisms/deepep.md)"))
    deepep_rdma_bandwidth: BytesPerSecond | None = Field(default=None, gt=0, description=(
        "flex: DeepEP's achieved RDMA bandwidth per GPU, counted as DeepEP's tests count it (tokens x distinct "
        "destination nodes x hidden x bytes / time); None: the DeepEP README's H800 table by nodes in the EP group "
        "(2: 43, 4: 58, 8+: 51 GB/s dispatch; 43/57/50 combine), scaled by the GPU's NIC line rate / 50 GB/s"))
    deepep_nvlink_bandwidth: BytesPerSecond | None = Field(default=None, gt=0, description=(
        "flex: DeepEP's achieved NVLink bandwidth per GPU (tokens received per rank x hidden x bytes / time); "
        "None: the README's intranode EP 8 row (153 GB/s dispatch, 158 combine on H800's 200 GB/s NVLink) as a "
        "fraction of this node's NVLink line rate"))
    deepep_sms: int = Field(default=20, ge=0, description=(
        "flex: SMs DeepEP's kernels hold while they run (Megatron-Core --moe-flex-dispatcher-num-sms, None -> 20, "
        "'DeepEP's historical mcore default'): compute overlapping a dispatch or combine (moe.a2a_overlap's pairs, "
        "a shared expert) runs on the rest (sim.engine.sm_contention); 0: off"))
    capacity_factor: float | None = Field(default=None, gt=0, description=(
        "--moe-expert-capacity-factor: an expert takes at most this x its even share of the token-expert pairs "
        "(the rest are dropped); None: dropless"))
    pad_to_capacity: bool = Field(default=False, description=(
        "--moe-pad-expert-input-to-capacity: every expert's input padded to its capacity (fixed shapes)"))
    imbalance: float = Field(default=1.0, ge=1.0, description=(
        "routing imbalance: the most loaded expert rank's token-expert pairs / the mean; the slowest rank sets the "
        "pace of the all-to-all and the expert GEMMs (1: even routing; not with force_load_balancing)"))
    force_load_balancing: bool = Field(default=False, description=(
        "--moe-router-force-load-balancing (benchmarking): the router's logits replaced by i.i.d. normal ones, new "
        "per micro-batch and layer, so each token goes to a uniformly random top-k subset of the experts; the "
        "busiest EP rank's expected token-expert pairs / the mean then replace moe.imbalance, from the tokens, "
        "top-k, experts and ep (sim.parallel.forced_balance, docs/mechanisms/forced_load_balancing.md)"))
    host_sync: bool | None = Field(default=None, description=(
        "whether the token dispatcher waits on the host for the routed token counts in every MoE layer's forward "
        "(Megatron-Core: the dropless alltoall dispatcher's cuda_dtoh_stream.synchronize(), the allgather "
        "dispatcher's .cpu(), DeepEP's dispatch waiting for the received counts): then a MoE layer pass takes at "
        "least the host's time to issue it (costs.eager_op_overhead; docs/mechanisms/moe_host_sync.md). None: "
        "Megatron's rule, every dispatcher but alltoall with pad_to_capacity (fixed shapes, no sync); off under "
        "training.cuda_graphs"))
    a2a_overlap: bool = Field(default=False, description=(
        "--overlap-moe-expert-parallel-comm --delay-wgrad-compute (Megatron-Core's combined 1F1B): one more "
        "warm-up forward, then each steady forward issued with a backward of another micro-batch, the two "
        "interleaved layer by layer so each one's dispatch/combine runs under the other's compute "
        "(docs/mechanisms/a2a_overlap.md); needs ep > 1, the alltoall or flex dispatcher, the interleaved "
        "schedule with vpp >= 2 when pp > 1, no full recomputation and no recompute module moe"))

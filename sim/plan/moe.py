"""The Plan's MoE exchanges: tokens each rank routes, the expert load and the bytes and seconds of dispatch/combine.

In: the ``moe`` section, the model, the grid and batch (``ParamFacts`` and below). Out: ``MoeFacts``: local experts;
tokens dispatched per rank and micro-batch, the most loaded rank's share (capacity, imbalance, forced balance's random
routing), the token-expert pairs its experts compute; the all-to-all and all-gather dispatchers' bytes and routing
skew; DeepEP's (flex) bytes, bandwidths, seconds and SMs, and the traffic the network models price its exchanges
from; the host's issue time behind the dispatcher's host sync (sim.costs.host).
"""

from __future__ import annotations

from sim.costs import host
from sim.network import deepep
from sim.parallel import forced_balance
from sim.plan.cached import cached_property
from sim.plan.params import ParamFacts
from sim.spec.scenario import CalibratedCostsSpec, RooflineCostsSpec


class MoeFacts(ParamFacts):
    """A MoE layer's tokens and exchanges (a base of ``sim.plan.Plan``)."""

    @cached_property
    def local_experts(self) -> int:
        """Routed experts on one rank of a MoE layer: E / ep."""
        return (self.model.num_moe_experts or 1) // self.ep

    @cached_property
    def dispatch_tokens(self) -> float:
        """Tokens one rank routes per micro-batch and MoE layer: b*s/(cp*tp) (sequence parallelism, which the rules
        require with tp > 1; a CP rank holds s/cp tokens)."""
        tokens = self.micro_batch * self.local_seq_len
        return tokens / self.tp if self.sequence_parallel else float(tokens)

    @cached_property
    def routing_imbalance(self) -> tuple[float, float]:
        """The busiest rank / the mean before any capacity: (the token-expert pairs its experts compute, the pairs
        the all-to-all delivers to it). ``moe.imbalance`` for both, or under ``moe.force_load_balancing``
        (Megatron-Core's random router) the expected maximum over the ep ranks (sim.parallel.forced_balance):
        the experts see the tokens of the etp x ep ranks (b*s/tp each; the alltoall dispatcher's etp all-gather,
        or the allgather dispatcher's etp x ep group), the all-to-all's receiver those of the ep ranks."""
        moe = self.scenario.moe
        if not moe.force_load_balancing:
            return moe.imbalance, moe.imbalance
        experts, topk = self.model.num_moe_experts or 1, self.model.moe_router_topk
        return (forced_balance.busiest_rank_load(self.dispatch_tokens * self.ep * self.etp, experts, topk, self.ep),
                forced_balance.busiest_rank_load(self.dispatch_tokens * self.ep, experts, topk, self.ep))

    def _capped(self, load: float) -> float:
        """A load (busiest / mean) capped by the capacity factor (tokens over it are dropped) and by ep (a rank
        cannot receive more than every token: with ep = 1 the one rank computes all its pairs however they
        route)."""
        cap = self.scenario.moe.capacity_factor
        return min(load, float(self.ep)) if cap is None else min(load, cap, float(self.ep))

    @cached_property
    def expert_load(self) -> float:
        """The most loaded expert rank's token-expert pairs / the mean (the slowest rank sets the pace):
        ``moe.capacity_factor`` when padded to capacity (every expert gets exactly its capacity), else
        ``routing_imbalance`` (``moe.imbalance``, or forced balance's expected maximum) capped by the capacity
        factor and by ep."""
        moe = self.scenario.moe
        if moe.capacity_factor is not None and moe.pad_to_capacity:
            return moe.capacity_factor
        return self._capped(self.routing_imbalance[0])

    @cached_property
    def routed_tokens(self) -> float:
        """Token-expert pairs this rank's local experts compute per micro-batch and MoE layer: its etp group's
        dispatched tokens x top-k (the alltoall dispatcher all-gathers the received tokens over the etp group;
        the allgather dispatcher keeps those routed to its experts out of the etp x ep group's), x the load of
        the most loaded rank (``expert_load``). Uniform: b*s/tp * topk * etp."""
        return self.dispatch_tokens * self.model.moe_router_topk * self.etp * self.expert_load

    @cached_property
    def dispatch_bytes(self) -> float:
        """The all-to-all "size" of one dispatch (and of one combine): the bytes a rank sends, its tokens x top-k
        x hidden x dtype (nccl-tests all_to_all: size/ep to each peer); padded to capacity, x the capacity factor
        (Megatron pads the exchanged tokens too). The hottest receiver's share is ``dispatch_skew``."""
        moe = self.scenario.moe
        padded = moe.capacity_factor if moe.capacity_factor is not None and moe.pad_to_capacity else 1.0
        return self.dispatch_tokens * self.model.moe_router_topk * self.model.hidden_size * self.elem_bytes * padded

    @cached_property
    def dispatch_skew(self) -> float:
        """The all-to-all's routing skew: the most loaded rank receives this x the mean (``routing_imbalance``'s
        receiver share, capped as ``expert_load``, at most ep: one rank receiving everything; 1 when padded, where
        every expert receives its capacity). The network prices it (sim.network.models, ``skew``: the hot
        receiver's ingress sets the time)."""
        moe = self.scenario.moe
        if moe.capacity_factor is not None and moe.pad_to_capacity:
            return 1.0
        if moe.force_load_balancing and self.deepep_traffic is not None:
            return self._capped(self.deepep_forced_skew)
        return self._capped(self.routing_imbalance[1])

    @cached_property
    def deepep_forced_skew(self) -> float:
        """flex under ``moe.force_load_balancing``: DeepEP moves distinct tokens, not pairs, so its hottest
        receivers are counted in tokens: over RDMA a rank receives, from the ep group's ranks of its local index
        (one per node), the tokens reaching its node; over NVLink the tokens reaching it from the whole group
        (sim.parallel.forced_balance.busiest_receiver_tokens). One skew for the exchange: the slower tier's time
        with its own skew over the slower tier's time without, so DeepEP's closed form (the slower tier sets
        the time, x the skew) gives max(RDMA x its skew, NVLink x its skew), at the dispatch's bandwidths."""
        traffic = self.deepep_traffic
        assert traffic is not None
        domains, _ = self.deepep_shape
        experts, topk = self.model.num_moe_experts or 1, self.model.moe_router_topk
        tokens = self.dispatch_tokens
        rdma = traffic.rdma_bytes / traffic.rdma_bandwidth[0] if traffic.rdma_bytes > 0 else 0.0
        nvlink = traffic.nvlink_bytes / traffic.nvlink_bandwidth[0]
        if max(rdma, nvlink) <= 0:
            return 1.0
        rdma_skew = forced_balance.busiest_receiver_tokens(tokens * domains, experts, topk, domains, self.ep)
        nvlink_skew = forced_balance.busiest_receiver_tokens(tokens * self.ep, experts, topk, self.ep, self.ep)
        return max(rdma * rdma_skew, nvlink * nvlink_skew) / max(rdma, nvlink)

    @cached_property
    def expert_gather_bytes(self) -> float:
        """With etp > 1 (alltoall dispatcher): the all-gather of the received tokens over the etp group, and the
        reduce-scatter of the outputs, each of the gathered size: routed tokens x hidden x dtype."""
        return self.routed_tokens * self.model.hidden_size * self.elem_bytes

    @cached_property
    def allgather_dispatch_bytes(self) -> float:
        """The allgather dispatcher's all-gather (and reduce-scatter) over the etp x ep group, gathered size:
        every member's tokens x hidden x dtype."""
        return self.dispatch_tokens * self.ep * self.etp * self.model.hidden_size * self.elem_bytes

    # ------------------------------------------------------------------------------------------- DeepEP (flex)
    @cached_property
    def deepep_shape(self) -> tuple[int, int]:
        """flex (DeepEP): the EP group's (NVLink domains, ranks per domain), from rank 0's group (Megatron-Core
        lays the EP group out alike on every stage)."""
        domain = self.scenario.cluster.nvlink_domain
        group = self.grid.ep_group(0)
        domains = len({rank // domain for rank in group})
        return domains, len(group) // domains

    @cached_property
    def deepep_bytes(self) -> tuple[float, float]:
        """flex: (RDMA, NVLink) bytes one rank's dispatch (and combine) moves as DeepEP counts them: its tokens x
        distinct destination nodes (or ranks) x hidden x dtype (sim.network.deepep.deepep_bytes)."""
        domains, per_domain = self.deepep_shape
        return deepep.deepep_bytes(self.dispatch_tokens, self.model.hidden_size, self.elem_bytes,
                                   self.model.num_moe_experts or 1, self.model.moe_router_topk, domains, per_domain)

    @cached_property
    def deepep_seconds(self) -> tuple[float, float]:
        """flex: (dispatch, combine) seconds of one DeepEP exchange: the slower of its RDMA and NVLink parts at
        DeepEP's achieved bandwidths (``moe.deepep_rdma_bandwidth`` / ``deepep_nvlink_bandwidth``, defaults from
        DeepEP's README table), x the routing skew; 0 on the ideal network."""
        traffic = self.deepep_traffic
        if self.scenario.network.model == "ideal" or traffic is None:
            return 0.0, 0.0
        return (traffic.seconds(deepep.DISPATCH, self.dispatch_skew),
                traffic.seconds(deepep.COMBINE, self.dispatch_skew))

    @cached_property
    def deepep_traffic(self) -> deepep.DeepepTraffic | None:
        """flex: one rank's DeepEP bytes (``deepep_bytes``) and the achieved (dispatch, combine) bandwidths
        (``moe.deepep_rdma_bandwidth`` / ``deepep_nvlink_bandwidth``, defaults from DeepEP's README table over
        the GPU's NIC share and the node's NVLink), which the network models price the exchanges from (the
        contention model as flows on the links: sim.network.deepep.deepep_flows); None without flex."""
        if not self.is_moe or self.scenario.moe.token_dispatcher != "flex":
            return None
        moe, cluster = self.scenario.moe, self.scenario.cluster
        domains, _ = self.deepep_shape
        nic = cluster.inter_node.bandwidth * cluster.nics_per_node / cluster.gpus_per_node
        rdma, nvlink = self.deepep_bytes
        rdma_bw = tuple(moe.deepep_rdma_bandwidth or deepep.rdma_bandwidth(domains, nic, combine)
                        for combine in (False, True))
        nvlink_bw = tuple(moe.deepep_nvlink_bandwidth or deepep.nvlink_bandwidth(cluster.intra_node.bandwidth,
                                                                                   combine)
                          for combine in (False, True))
        return deepep.DeepepTraffic(rdma, nvlink, (rdma_bw[0], rdma_bw[1]), (nvlink_bw[0], nvlink_bw[1]))

    @cached_property
    def deepep_sms(self) -> int:
        """SMs a DeepEP exchange holds while it runs (``moe.deepep_sms`` with the flex dispatcher; 0 otherwise, or
        where the ideal network makes the exchanges free)."""
        moe = self.scenario.moe
        if not self.is_moe or moe.token_dispatcher != "flex" or self.scenario.network.model == "ideal":
            return 0
        return moe.deepep_sms

    # ----------------------------------------------------------------------------------------------- host sync
    @cached_property
    def moe_host_seconds(self) -> dict[str, float]:
        """Per direction (``forward``, ``backward``), the host's seconds to issue one MoE layer pass where the token
        dispatcher syncs the host every MoE layer (``moe.host_sync``; None: Megatron-Core's rule, every dropless
        dispatcher, i.e. all but alltoall with ``pad_to_capacity``), the pass then lasting at least that long
        (sim.costs.host, docs/mechanisms/moe_host_sync.md: eager ops, expert GEMM launches, Transformer Engine
        linear-module calls and Megatron-Core's own MoE code; under ``moe.a2a_overlap`` the combined 1F1B's
        schedule nodes, ``costs.a2a_overlap_node_overhead`` per node call); 0 without a sync, under CUDA graphs,
        fixed costs or ``costs.eager_op_overhead`` 0."""
        moe, costs, training = self.scenario.moe, self.scenario.costs, self.scenario.training
        syncs = moe.host_sync if moe.host_sync is not None else not (
            moe.token_dispatcher == "alltoall" and moe.pad_to_capacity)
        if (not self.model.is_moe or not syncs or training.cuda_graphs
                or not isinstance(costs, (RooflineCostsSpec, CalibratedCostsSpec)) or not costs.eager_op_overhead):
            return {"forward": 0.0, "backward": 0.0}
        spec = self.model
        te_modules = host.te_linear_modules(spec.kv_lora_rank is not None, spec.q_lora_rank is not None,
                                            bool(spec.moe_shared_expert_intermediate_size))
        # under moe.a2a_overlap each pass runs as Megatron's combined 1F1B schedule nodes, which the host issues too
        nodes = costs.a2a_overlap_node_overhead if self.a2a_overlap else 0.0
        return {direction: host.moe_layer_host_seconds(direction, self.local_experts, costs.eager_op_overhead,
                                                       costs.launch_overhead, costs.te_module_overhead, te_modules,
                                                       costs.megatron_moe_host_ops)
                + host.schedule_node_host_seconds(direction, nodes)
                for direction in ("forward", "backward")}

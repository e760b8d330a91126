"""A MoE layer priced: its MLP part's blocks and exchanges, and what DualPipe's F&B pairs hide.

In: ``BlockPricing`` (the attention block's pieces, TP and CP collectives) and a ``Plan`` with MoE layers. Out:
``MoePricing``: a MoE piece's seconds (sim.workload.step.moe_blocks, cached by shape); a dispatch's or combine's
exchanges on the ``ep`` stream; one MoE layer's forward, backward and weight-gradient pass, with its blocks cut where a
pair cuts them (``_moe_layer``), behind the dispatcher's host sync from the end of SP's leading all-gather
(``_moe_host_lead``); what full recomputation adds under the host bound (``_rebuilt_moe``); what a stage's F&B pairs
hide (``_pair_overlap``: the pair's span replayed by sim.explore.pair_replay; docs/mechanisms/a2a_overlap.md,
dualpipe.md).
"""

from __future__ import annotations

from sim.costs.host import host_bound
from sim.costs.models import ComputePhase
from sim.explore.estimate_blocks import BlockPricing
from sim.explore.estimate_records import _ChunkLayers, _PairBlocks
from sim.explore.pair_replay import Block, alone, chain, pair_span
from sim.plan import Plan
from sim.workload import step


class MoePricing(BlockPricing):
    """A MoE layer's passes and blocks, and what F&B pairs hide (a base of sim.explore.estimate's ``Estimator``)."""

    def _moe_price(self, plan: Plan, name: str, phase: ComputePhase) -> float:
        """Seconds of one piece of a MoE layer's MLP part (sim.workload.step.moe_blocks), cached by shape."""
        t = plan.scenario.training
        shape = ("moe", plan.micro_batch, plan.local_seq_len, plan.tp, plan.sequence_parallel, plan.etp,
                 plan.local_experts, plan.routed_tokens, plan.dtype, t.fp8_cast_kernels, t.fp8_weight_cache,
                 plan.microbatches, plan.recompute_modules)
        key = (name, phase, shape)
        if key not in self._compute:
            if shape not in self._moe_blocks:
                self._moe_blocks[shape] = step.moe_blocks(plan) | {
                    f"recompute_{block}": work for block, work in step.moe_recompute(plan).items()}
            work = self._moe_blocks[shape][name]
            self._compute[key] = self.costs.compute_time(work, phase) if work.ops else 0.0
        return self._compute[key]

    def _exchanges(self, plan: Plan, exchanges: tuple[step.Exchange, ...]) -> float:
        """A MoE layer's dispatch or combine: its collectives one after another on the ``ep`` stream."""
        return sum(step.exchange_seconds(plan, self.net, ex) for ex in exchanges)

    def _moe_layer(self, plan: Plan, times: list[float],
                   overlapped: bool) -> tuple[float, float, float, tuple[Block, ...], tuple[Block, ...]]:
        """(forward, backward, weight-gradient pass, forward blocks, backward blocks) of one MoE layer, as the workload
        emits it (``MoeLayerEmitter.forward`` / ``backward``, sim.workload.moe_emit): the attention block with its TP
        collectives, then router -> dispatch beside the shared expert (with its SP all-gather and reduce-scatter) ->
        experts -> combine -> unpermute; the backward mirrors it, the dispatch's gradient exchange beside the shared
        expert's backward (and selective recomputation's replay of it).

        The blocks (sim.explore.pair_replay.Block) are the layer's passes cut where a DualPipe F&B pair cuts them
        (sim.workload.pair_interleave.interleave_pair: before each compute task that waits for an ``ep`` exchange), for
        ``_pair_overlap``: forward attention+router | experts | unpermute, backward [module moe's replayed forward]
        unpermute | experts | router+attention; each pass is its blocks run alone (``pair_replay.alone``)."""
        split = plan.splits_backward
        bwd: ComputePhase = "input_grad" if split else "backward"
        tp_comm = sum(times) if times else 0.0
        dispatch = self._exchanges(plan, step.dispatch_exchanges(plan))
        combine = self._exchanges(plan, step.combine_exchanges(plan))
        price = self._moe_price
        shared_tp = tp_comm if price(plan, "moe_shared", "forward") > 0 else 0.0
        chunked = self._chunked_collectives(plan)
        attention_f = (self._price(plan, "attention", "forward") + tp_comm if chunked is None
                       else self._chunked_forward(plan, "attention", "forward", chunked))
        attention_b = (self._overlapped_backward(plan, "attention", times, chunked) if overlapped
                       else self._price(plan, "attention", bwd) + tp_comm + self._regather(plan))
        attention_b += self._price(plan, "recompute_attention", "forward")
        cp_f, cp_b = self._cp_exposed(plan, bwd)
        attention_f, attention_b = attention_f + cp_f, attention_b + cp_b
        # the MoE part's forward: router -> dispatch beside the shared expert -> experts -> combine -> unpermute.
        # The shared expert's SP all-gather waits for the router and the expert for the gather; its
        # reduce-scatter only the pass's experts wait for (MoeLayerEmitter.shared_expert).
        gather, reduce = times if shared_tp > 0 else (0.0, 0.0)  # MoE with TP runs SP (Megatron-Core's rule)
        mlp_forward = (Block(price(plan, "moe_router", "forward"), dispatch,
                             gather + price(plan, "moe_shared", "forward"), reduce,
                             price(plan, "moe_router", "forward") if shared_tp > 0 else None),
                       Block(price(plan, "moe_experts", "forward"), combine, 0.0),
                       Block(price(plan, "moe_combine", "forward"), None, 0.0))
        lead = 0.0 if plan.tp > 1 else None  # the attention block starts with SP's all-gather (MoE with TP runs SP)
        forward_blocks = tuple(chain([(Block(attention_f, None, 0.0, 0.0, lead),), mlp_forward]))
        # Selective recomputation (the emitter's _selective_recompute and MoeLayerEmitter.backward): module moe runs the
        # MoE forward again before its backward; else the pre-MLP norm, moe_act's activation and the shared expert, the
        # last beside the dispatch's gradient as the emitter issues it. The backward's first SP all-gather waits only
        # for the unpermute's backward (its source), so on the TP stream it runs beside the combine's gradient exchange
        # and the experts' backward; only what outlasts them is exposed.
        shared_again = price(plan, "recompute_moe_shared", "forward")
        shared_b = (price(plan, "moe_shared", bwd) + (shared_again + reduce + gather if shared_again > 0 else 0.0)
                    + max(0.0, gather - dispatch - price(plan, "recompute_moe_experts", "forward")
                          - price(plan, "moe_experts", bwd)))
        replayed = mlp_forward if "moe" in plan.recompute_modules else ()
        backward_blocks = tuple(chain([replayed, (
            Block(price(plan, "recompute_moe_router", "forward") + price(plan, "moe_combine", bwd), dispatch, 0.0),
            Block(price(plan, "recompute_moe_experts", "forward") + price(plan, "moe_experts", bwd), combine,
                  shared_b, reduce),
            Block(price(plan, "moe_router", bwd) + attention_b, None, 0.0, 0.0,
                  None if lead is None else price(plan, "moe_router", bwd)))]))
        weight = (self._price(plan, "attention", "weight_grad")
                  + sum(price(plan, name, "weight_grad") for name in ("moe_router", "moe_shared", "moe_experts"))
                  if split else 0.0)
        # behind the dispatcher's host sync a pass lasts at least the host's time to issue it (sim.costs.host),
        # counted as the simulation counts it: from the end of the forward's first task where that is SP's
        # all-gather (LayerEmitter._moe_host: a collective's length is the network's)
        host = plan.moe_host_seconds
        return (host_bound(alone(forward_blocks), self._moe_host_lead(plan, times) + host["forward"]),
                host_bound(alone(backward_blocks), host["backward"] + plan.moe_replay_host_seconds), weight,
                forward_blocks, backward_blocks)

    def _moe_host_lead(self, plan: Plan, times: list[float]) -> float:
        """Seconds of a MoE layer forward before the host's issue time counts (the simulation's
        ``LayerEmitter._moe_host``: from the end of the pass's first task where that is a collective, whose length
        is the network's): SP's all-gather that starts the attention block under TP without chunked overlap."""
        return times[0] if plan.tp > 1 and times and self._chunked_collectives(plan) is None else 0.0

    @staticmethod
    def _rebuilt_moe(plan: Plan, forward: float, backward: float, forward_blocks: tuple[Block, ...],
                     backward_blocks: tuple[Block, ...], lead: float = 0.0) -> float:
        """Seconds full recomputation adds to a MoE layer's backward (``forward`` and ``backward``: its passes, each
        host-bound on its own; the blocks: their device work, ``_moe_layer``). The emitter reruns the layer's forward,
        host sync and eager ops included, inside the backward pass, so the host issues both in one pass
        (``LayerEmitter._layer_tasks``, sim.workload.layer_emit): the rebuilt backward lasts max(device forward +
        backward, host forward + backward), not the sum of the two passes' maxima (Qwen3-235B tp 4, pp 8, vpp 12,
        micro-batch 2, ep 4, full recomputation: +5.4% over the simulation that way); the host's time counted from the
        end of the rebuilt pass's first task where that is SP's all-gather (``lead``, as ``_moe_layer``). Without a host
        bound: the forward."""
        host = plan.moe_host_seconds
        if not host["forward"] and not host["backward"]:
            return forward
        return host_bound(alone(forward_blocks) + alone(backward_blocks),
                          lead + host["forward"] + host["backward"]) - backward

    def _pair_overlap(self, plan: Plan, pair: _PairBlocks, chunks: tuple[_ChunkLayers, ...],
                      mix: tuple[tuple[int, int, int], ...] = ()) -> float:
        """What a stage's F&B pairs hide, as ``stage_level_replay`` subtracts it (``pair_overlap / chunks`` per
        pair): the pair's passes run alone less their span replayed as the emitter interleaves them
        (sim.explore.pair_replay.pair_span), averaged over the pairs the schedule issues, times the chunks: under
        DualPipe a forward of one local chunk with a backward of the other (F0B1 and F1B0, about as many of each);
        under moe.a2a_overlap the stage's own (forward chunk, backward chunk, count) ``mix``
        (sim.parallel.schedules.combined_pairs).
        Each pass is its chunk's layers as blocks (``_PairBlocks``): the forward from the embedding to the head,
        the backward from the head down, a layer full recomputation rebuilds running its forward again first."""
        bwd: ComputePhase = "input_grad" if plan.splits_backward else "backward"
        passes = []
        for embedding, head, layers in chunks:
            forward: list[tuple[Block, ...]] = []
            backward: list[tuple[Block, ...]] = []
            if embedding:
                forward.append((Block(self._price(plan, "embedding", "forward"), None, 0.0),))
            if head:
                backward.append((Block(self._price(plan, "head", bwd), None, 0.0),))
            for moe, recomputed in reversed(layers):
                blocks = pair.moe if moe else pair.dense
                backward += [blocks[0], blocks[1]] if recomputed else [blocks[1]]
            forward += [pair.moe[0] if moe else pair.dense[0] for moe, _ in layers]
            if head:
                forward.append((Block(self._price(plan, "head", "forward") + self._loss_comm(plan), None, 0.0),))
            if embedding:
                backward.append((Block(self._price(plan, "embedding", bwd), None, 0.0),))
            moe_layers = sum(moe for moe, _ in layers)
            passes.append((chain(forward), chain(backward), moe_layers))
        # Behind the dispatcher's host sync (sim.costs.host) each MoE layer pass lasts at least the host's time to
        # issue it: alone, its device time or that, whichever is longer; in a pair the host issues both passes'
        # layers one after the other, so the pair lasts at least their sum (the host stream in the simulation).
        host = plan.moe_host_seconds
        moe_f = alone(pair.moe[0])
        moe_b = alone(pair.moe[1])
        host_b = host["backward"] + plan.moe_replay_host_seconds  # module moe's replayed forward with it
        extra = (max(0.0, host["forward"] - moe_f), max(0.0, host_b - moe_b))
        # DeepEP's kernels hold n of the GPU's S SMs (Plan.deepep_sms): compute under an exchange runs on the rest
        # (pair_span's ``held``; sim.engine.sm_contention in the simulation)
        held = plan.deepep_sms / (plan.scenario.cluster.gpu.sms or 1) if plan.deepep_sms else 0.0

        def hides(a: int, b: int) -> float:
            forward, _, moe_forward = passes[a]
            _, backward, moe_backward = passes[b]
            apart = alone(forward) + moe_forward * extra[0] + alone(backward) + moe_backward * extra[1]
            issue = moe_forward * host["forward"] + moe_backward * host_b
            return apart - max(pair_span(forward, backward, held), issue)

        if mix:
            return len(passes) * sum(count * hides(a, b) for a, b, count in mix) / sum(count for _, _, count in mix)
        hidden = [hides(a, b) for a in range(len(passes)) for b in range(len(passes)) if a != b]
        return len(passes) * sum(hidden) / len(hidden) if hidden else 0.0

"""Recorded chains and their stamps: a layer's tasks (in a lazy graph a whole pass's) recorded once and emitted again.

In: the block emitter (``BlockEmitter`` and below: the graph, the chain-rule flags its tasks set). Out:
``ChainEmitter``: whether a pass may stamp its layers' chains without the per-layer path (``_stamping``), the chain
a layer's pass repeats (``_chain_key``: direction, full recomputation, MoE, frozen), a recorded chain (``_record``,
``_stamp_entry``: each task's fields and its chain rule), its stamp (``_stamp``, ``TaskGraph.stamp``), and in a lazy
graph a whole pass with its send as one chain (``_pass_chain``, ``_stamp_pass``, ``_fast_pass``, ``reads_first``).
The graph is the same as emitting every task one by one (tests/test_workload.py, tests/test_lazy_graph.py).
"""

from __future__ import annotations

from typing import Literal

from sim.workload.block_emit import BlockEmitter
from sim.workload.ir import EXPERT_DP_STREAM, NCCL_STREAM, Chain, Task


class ChainEmitter(BlockEmitter):
    """Recording and stamping chains (a base of ``sim.workload.build._StageEmitter``)."""

    def _stamping(self, mb: int, direction: str) -> tuple[dict[str, Chain] | None, dict[int, str]]:
        """The recorded chains a pass may stamp layer by layer without the per-layer path (``_layer``), and its
        layers' chain keys: chains only where ``_layer_tasks`` would stamp (fixed durations, the data-parallel
        hooks inert inside layers) and every per-layer hook does nothing in this pass (no activation offload,
        ``DataParallelEmitter.layers_inert``); else None."""
        key = (direction, mb == 0)  # what the answer depends on (DataParallelEmitter.inert, layers_inert)
        stamps = self.stamping.get(key)
        if stamps is None:
            dp = self.dp
            stamps = self.stamping[key] = bool(self.fixed_durations and not self.offload
                                               and (self.dp_inert or dp.inert(mb, direction))
                                               and dp.layers_inert(mb, direction))
        return (self.chains if stamps else None), self.chain_keys[direction]

    def _pass_chain(self, phase: Literal["F", "B"], chunk: int, to_global_chunk: int, chains: dict[str, Chain],
                    keys: dict[int, str]) -> tuple[Chain, int, tuple[tuple[int, int], ...], int] | None:
        """A lazy graph's pass of local ``chunk`` (neither the embedding's nor the head's) as one chain: its layers'
        recorded chains end to end, then its send, so a confirmation keeps one record and replays one unit per
        pass instead of a record per layer and a send task (issue 25: on the 175B search's layouts of one to three
        layers per chunk, a pass's send, its Python and its replay were most of a confirmation). The same tasks as
        stamping layer by layer and adding the send (``_send``): each layer's entries with their rules (their
        ``extra`` offsets are within their layer, the blocking TP collective carried from layer to layer as
        ``Chain.stamp`` carries it), and the send after the last one, depending on it and on the TP collective then
        blocking (the ``also`` edge of ``_send``: an entry of the pass, or none), and becoming the blocking one where
        p2p waits (``p2p_blocks``). None, and stamped layer by layer as before, until every layer's chain is recorded
        (micro-batch 0's pass records them), at the turn of a V (nothing is sent), or where the collective blocking
        at the send would be the one given at the pass's start (an edge a chain's offsets cannot name). Returns the
        chain, its send's entry, each layer's last entry and the chunk's global index."""
        direction = "forward" if phase == "F" else "backward"
        cached = self.pass_chains.get((phase, chunk), False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        layers = self._layers(chunk) if phase == "F" else reversed(self._layers(chunk))
        parts = [(layer, chains.get(keys.get(layer) or self._key(keys, direction, layer))) for layer in layers]
        stream = self.g.streams.get((self.rank, "pp"))
        if any(chain is None for _, chain in parts) or stream is None:
            return None  # not yet: recorded by this pass (stamped layer by layer meanwhile)
        _, group, name = self._route(phase, chunk, to_global_chunk)
        entries = [entry for _, chain in parts for entry in chain.entries]  # type: ignore[union-attr]
        state = -1  # the blocking TP collective as Chain.__init__ follows it: -1 the one given, -2 none, k entry k
        for k, entry in enumerate(entries):
            if entry[11] and state != -2:
                state = -2
            if entry[12]:
                state = k
        if group is None or state == -1:
            self.pass_chains[(phase, chunk)] = None
            return None
        send = len(entries)
        entries.append(("pp", "pp", name, None, "send", self.p2p_bytes, 0.0, group, 1.0, True,
                        (send - state,) if state >= 0 else (), False, self.p2p_blocks, False, stream.append))
        protos = [proto for _, chain in parts for proto in chain.protos]  # type: ignore[union-attr]
        protos.append(Task(-1, self.rank, self.stage, "pp", "pp", name, -1, -1, (), None, "send", self.p2p_bytes,
                           0.0, group))
        ends, at = [], 0
        layer_of: list[int] = []
        for layer, chain in parts:
            size = len(chain.entries)  # type: ignore[union-attr]
            layer_of += [layer] * size
            at += size
            ends.append((layer, at - 1))
        chains_list = self.g.chains
        chains_list.append(Chain(entries, protos, self.rank, self.stage, len(chains_list), (*layer_of, -1)))
        fused = self.pass_chains[(phase, chunk)] = (chains_list[-1], send, tuple(ends), self._global_chunk(chunk))
        return fused

    def _stamp_pass(self, fused: tuple[Chain, int, tuple[tuple[int, int], ...], int], phase: Literal["F", "B"],
                    g: int, mb: int) -> None:
        """Stamps a pass's chain (``_pass_chain``) for micro-batch ``mb`` and keeps what ``forward`` / ``backward``
        keep of its tasks: its last compute task (``tail``), its send, the layers' gradients (``grad_ready``,
        backward without split weight gradients)."""
        chain, send, ends, _ = fused
        first = len(self.g.tasks)
        _, self.blocking_tp = self.g.stamp(chain, mb, -1, None, self.blocking_tp)
        self.tail = first + send - 1
        self.sends[(phase, g, mb)] = first + send
        if phase == "B" and not self.splits_backward:
            grad_ready = self.grad_ready
            for layer, end in ends:
                grad_ready[layer] = first + end

    def _fast_pass(self, fused: tuple[Chain, int, tuple[tuple[int, int], ...], int], phase: Literal["F", "B"],
                   mb: int) -> None:
        """``_stamp_pass`` and ``_wait_upstream`` of a pass whose chain ``forward`` / ``backward`` found at an
        earlier micro-batch (not 0): its first task reads the input (no gather before it: ``_first_reading``) and
        waits for the neighbouring chunk's pass of the same phase (``parallel.chunks.upstream`` on a chunk that
        is neither the first nor the last)."""
        chain, send, ends, g = fused
        graph = self.g
        first = len(graph.tasks)
        _, self.blocking_tp = graph.stamp(chain, mb, -1, None, self.blocking_tp)
        self.tail = first + send - 1
        self.sends[(phase, g, mb)] = first + send
        if phase == "B":
            self.waits.append((first, ("B", g + 1, mb)))
            if not self.splits_backward:
                grad_ready = self.grad_ready
                for layer, end in ends:
                    grad_ready[layer] = first + end
        else:
            self.waits.append((first, ("F", g - 1, mb)))

    def _key(self, keys: dict[int, str], direction: str, layer: int) -> str:
        key = keys[layer] = self._chain_key(direction, layer)
        return key

    def _chain_key(self, direction: str, layer: int) -> str:
        """Which recorded chain a layer's pass repeats: its direction, with full recomputation, MoE, frozen."""
        recomputes = direction == "backward" and self.plan.recomputes(layer)
        key = (f"{direction}+recompute" if recomputes else direction) + ("+moe" if self.moe_layers[layer] else "")
        if self.frozen_work is not None and direction == "backward" and self.plan.peft.layer_frozen(layer):
            key += "+frozen"
        return key

    def _stamp(self, chain: Chain, mb: int, layer: int, after: int | None) -> int | None:
        """Emits a recorded chain again for ``layer`` of micro-batch ``mb`` after ``after`` (``Chain.stamp``; a lazy
        graph keeps a record instead). Returns its last task."""
        after, self.blocking_tp = self.g.stamp(chain, mb, layer, after, self.blocking_tp)
        return after

    def _record(self, first: int) -> Chain:
        """The chain of the tasks emitted from task ``first`` on (one layer), to stamp for the next layers."""
        protos, chains = self.g.tasks[first:], self.g.chains
        chains.append(Chain([self._stamp_entry(task) for task in protos], protos, self.rank, self.stage, len(chains)))
        return chains[-1]

    def _stamp_entry(self, task: Task) -> tuple:
        """What stamping repeats of a recorded task: its fields, then its chain rule (``_flagged``; default: after
        the task before it on another stream, takes the blocking TP collective) decided once: ``prev``, the
        ``extra`` offsets, whether it waits for the blocking TP collective (a compute task that ``touch``-es it),
        whether it becomes the blocking one (a consumed collective, or any TP collective when Megatron's are
        synchronous), whether it needs a rendezvous key, and its stream list's ``append``."""
        prev, touch, extra, blocking = self.flags.get(task.id, (True, True, (), False))
        blocks = blocking or (touch and task.stream == "tp" and self.tp_blocks)
        return (task.stream, task.kind, task.name, task.duration, task.op, task.nbytes, task.flops, task.group,
                task.skew, prev, extra, touch and task.stream == "compute", blocks,
                bool(task.op) and self.g.match_collectives, self.g.streams[(self.rank, task.stream)].append)



def reads_first(chain: Chain) -> bool:
    """Whether a chain's first task is not a weight gather (``_StageEmitter._first_reading`` would pass it)."""
    return chain.stream not in (NCCL_STREAM, EXPERT_DP_STREAM)


"""Context parallelism (CP): a sequence split over cp ranks, and what its attention exchanges.

In: the CP degree, the communication type (Megatron-LM ``--cp-comm-type``: ``p2p``, ``all_gather``, ``a2a``), the
sequence length and a layer's per-TP-rank attention widths. Out, as plain numbers for the workload and the estimate:

- ``rank_chunks``: causal load balancing. The sequence is cut into 2*cp chunks and CP rank i holds chunks i and
  2cp-1-i (Megatron-LM ``get_batch_on_this_cp_rank``; Transformer Engine ``get_batch_on_this_cp_rank``), so every
  rank computes the same number of causal score blocks.
- ``ring_steps`` / ``step_shares``: the score blocks of each of the cp steps of ring attention
  (Transformer Engine ``AttnFuncWithCPAndKVP2P``), and each step's share of the rank's (s/cp) x s score matrix.
  A diagonal block executes ``sim.model.flash_tiles.causal_fraction`` of its tiles (the same FlashAttention tile rule as
  without CP, applied per chunk), so over all ranks the executed tiles are exactly the unsplit sequence's.
- ``correction_rows``: the output rows TE's ring rescales after each step (a memory-bound kernel per step).
- ``executed_share``: the share of the rank's full-matrix attention FLOPs its kernels execute (what the cost
  model prices; MFU keeps Megatron's full-matrix count).
- ``exchanges``: the collectives or sends of one layer's attention, per pass: ring attention's KV sends (and in
  the backward KV and dKV) overlapped with the step they feed; all_gather's all-gather of K and V (and the
  backward's re-gather and reduce-scatter of dK, dV); a2a's (DeepSpeed Ulysses) all-to-all of q, k, v before
  attention and of the output after it (the backward mirrors them).
- ``ring_buffer_bytes``: the receive buffers CP attention allocates beside the stash while a layer's attention
  runs (ring: all the forward's received KV blocks, the backward's two double-buffered KV + dKV blocks;
  all_gather: the gathered K and V, and in the backward their gradients).
- ``ring_makespan``: the time of a ring of compute blocks and sends, the schedule the task graph builds (a send is
  exposed only where it is longer than the block it overlaps).
- ``check_context``: the rules of a CP layout, one line each.

The network layer prices each exchange (sim.network.models: ``send`` over the link between ring neighbours,
collectives over the CP group). Mechanism and sources: docs/mechanisms/context_parallel.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sim.model.flash_tiles import FLASH_TILE, causal_fraction

CpCommType = Literal["p2p", "all_gather", "a2a"]


def rank_chunks(cp_rank: int, cp: int) -> tuple[int, int]:
    """The two of the 2*cp sequence chunks CP rank ``cp_rank`` holds: i and 2cp-1-i (a light early chunk paired
    with a heavy late one under causal attention)."""
    return cp_rank, 2 * cp - 1 - cp_rank


@dataclass(frozen=True)
class RingStep:
    """The score blocks of one ring step, in (s/2cp) x (s/2cp) chunk blocks: ``full`` computed whole, ``diagonal``
    causal blocks on the diagonal (the tiles on and below it)."""

    full: int
    diagonal: int


def ring_steps(cp: int, causal: bool = True) -> tuple[RingStep, ...]:
    """The blocks each of the cp steps of ring attention computes on one rank (Transformer Engine
    AttnFuncWithCPAndKVP2P.forward, the same on every rank thanks to ``rank_chunks``):

    - step 0, its own K and V: causal, the two diagonal blocks and q chunk 2cp-1-i against kv chunk i (q chunk i
      against kv chunk 2cp-1-i lies above the diagonal and is skipped): 1 full + 2 diagonal;
    - step k >= 1, the K and V of rank i-k: if k <= i, both q chunks against the first kv chunk ("if i <= rank":
      the kv's second chunk lies after both); otherwise q's second chunk against both kv chunks: 2 full either way.

    Without the causal mask every step is 2 x 2 full blocks."""
    if not causal:
        return (RingStep(4, 0),) * cp
    return (RingStep(1, 2),) + (RingStep(2, 0),) * (cp - 1)


def step_shares(seq_len: int, cp: int, causal: bool = True, tile: int = FLASH_TILE) -> tuple[float, ...]:
    """Per ring step, the share of the rank's (s/cp) x s full score matrix (4cp chunk blocks) it executes: a
    diagonal block runs ``causal_fraction`` of its tiles (FlashAttention-2 skips the tiles above the diagonal)."""
    diagonal = causal_fraction(seq_len // (2 * cp), tile)
    return tuple((step.full + step.diagonal * diagonal) / (4 * cp) for step in ring_steps(cp, causal))


def correction_rows(cp: int, causal: bool = True) -> tuple[float, ...]:
    """Per ring step, the share of a rank's output rows Transformer Engine's forward rescales and adds into the
    output (AttnFuncWithCPAndKVP2P.forward, after the steps: ``flash_attn_fwd_out_correction_init`` for step 0,
    ``flash_attn_fwd_out_correction`` for step k <= rank, the second half only, ``..._second_half_out_correction``,
    for k > rank), averaged over the cp ranks: 1 - k/(2cp); all rows without the causal mask. A memory-bound
    kernel over the output (step 0: read the step's output, write the output; later steps: read both, write the
    output); its backward counterpart (dq and dK, dV accumulated per step) is priced by the weightless op's
    backward rule (sim.costs.models.phase_scale)."""
    return tuple(1.0 if not causal else 1.0 - k / (2 * cp) for k in range(cp))


def executed_share(seq_len: int, cp: int, comm_type: CpCommType, causal: bool = True) -> float:
    """The share of a rank's full-matrix attention FLOPs (its s/cp queries against all s keys) its flash kernels
    execute. p2p and all_gather compute the same blocks (TE AttnFuncWithCPAndKVAllGather runs each local q chunk
    against the kv chunks up to its own); a2a (Ulysses) runs unsplit causal attention over all s tokens on
    heads/cp heads: ``causal_fraction(seq_len)``."""
    if comm_type == "a2a":
        return causal_fraction(seq_len) if causal else 1.0
    return sum(step_shares(seq_len, cp, causal))


@dataclass(frozen=True)
class CpExchange:
    """One exchange of a layer's CP attention on one rank: ``op`` (send, all_gather, reduce_scatter, all_to_all),
    its bytes (nccl-tests size: a send's payload, an all-gather's or reduce-scatter's gathered size, an
    all-to-all's bytes a rank sends), and where it sits: ``before`` the attention core, ``after`` it, or during
    ring step ``step`` (a send issued at that step's start, whose data the next step needs)."""

    op: str
    nbytes: float
    where: Literal["before", "ring", "after"]
    step: int = -1


def kv_bytes(micro_batch: int, local_seq: int, kv_width: float, elem_bytes: int) -> float:
    """K and V of a rank's tokens on one TP rank: 2 x b x s/cp x (kv heads / tp x head dim) x dtype: what one ring
    send carries (TE concatenates k and v into one p2p buffer)."""
    return 2.0 * micro_batch * local_seq * kv_width * elem_bytes


def exchanges(comm_type: CpCommType, cp: int, direction: Literal["forward", "backward"], micro_batch: int,
              local_seq: int, q_width: float, kv_width: float, elem_bytes: int) -> tuple[CpExchange, ...]:
    """The exchanges of one layer's attention in ``direction`` on one CP rank (none for cp = 1). Widths are per TP
    rank (q: heads/tp x head dim; kv: kv heads/tp x head dim).

    - p2p (TE AttnFuncWithCPAndKVP2P): forward, at step k < cp-1 a send of K and V to the next rank (the KV step
      k+1 computes on); backward, at step 0 K and V, at steps 1..cp-2 K, V and the dK, dV accumulated so far
      (TE's ``p2p_comm_buffers[i] = [kv, dkv]``), at step cp-1 dK, dV alone, which returns them to their owner.
    - all_gather (AttnFuncWithCPAndKVAllGather): forward, an all-gather of K and V over the CP group before
      attention; backward, the same all-gather again (only local K and V are saved) and a reduce-scatter of dK,
      dV after.
    - a2a (AttnFuncWithCPAndQKVOA2A, DeepSpeed Ulysses): forward, an all-to-all of q, k, v (sequence gathered,
      heads scattered) before attention and of the output after it; backward, of the output gradient before and
      of dq, dk, dv after."""
    if cp == 1:
        return ()
    kv = kv_bytes(micro_batch, local_seq, kv_width, elem_bytes)
    if comm_type == "p2p":
        if direction == "forward":
            return tuple(CpExchange("send", kv, "ring", k) for k in range(cp - 1))
        sizes = [kv] + [2 * kv] * (cp - 2) + [kv]
        return tuple(CpExchange("send", size, "ring", k) for k, size in enumerate(sizes))
    if comm_type == "all_gather":
        gather = CpExchange("all_gather", cp * kv, "before")
        return (gather,) if direction == "forward" else (gather, CpExchange("reduce_scatter", cp * kv, "after"))
    tokens = micro_batch * local_seq * elem_bytes
    qkv, out = tokens * (q_width + 2 * kv_width), tokens * q_width
    if direction == "forward":
        return CpExchange("all_to_all", qkv, "before"), CpExchange("all_to_all", out, "after")
    return CpExchange("all_to_all", out, "before"), CpExchange("all_to_all", qkv, "after")


def ring_buffer_bytes(comm_type: CpCommType, cp: int, direction: Literal["forward", "backward"], micro_batch: int,
                      local_seq: int, kv_width: float, elem_bytes: int) -> float:
    """Bytes ring attention (``p2p``) allocates beyond the layer's stash while one layer's attention runs in
    ``direction`` on one TP rank, in units of ``kv_bytes`` (a rank's K and V). Transformer Engine's
    ``AttnFuncWithCPAndKVP2P`` (transformer_engine/pytorch/attention.py; dot_product_attention/context_parallel.py
    in TE 2.x):

    - forward: ``p2p_comm_buffers = [None for _ in range(cp_size)]``; step i allocates step i+1's receive buffer
      (``p2p_comm_buffers[i + 1] = torch.empty_like(p2p_comm_buffers[i])``) and the list keeps every one until the
      forward returns: cp - 1 received KV blocks (buffer 0, the rank's own K and V concatenated, is what
      ``save_for_backward`` keeps in place of k and v, the stash);
    - backward: ``p2p_comm_buffers = [torch.empty((2, *kv.shape)), torch.empty((2, *kv.shape))]``, two buffers
      each holding a KV block and its dKV, reused in turn (double buffering): 4 KV blocks.

    ``all_gather`` (``AttnFuncWithCPAndKVAllGather``) holds the gathered, reordered ``k_ag``, ``v_ag`` through the
    attention: cp KV blocks in the forward; the backward gathers them again and accumulates dK, dV over the whole
    sequence before their reduce-scatter: 2 cp blocks (the moment of ``index_select``'s reordered copy, before
    the kernels, is not counted). 0 for cp = 1 and for ``a2a`` (Ulysses' all-to-all outputs replace q, k, v)."""
    if cp == 1 or comm_type == "a2a":
        return 0.0
    if comm_type == "all_gather":
        blocks = cp if direction == "forward" else 2 * cp
    else:
        blocks = cp - 1 if direction == "forward" else 4
    return blocks * kv_bytes(micro_batch, local_seq, kv_width, elem_bytes)


def ring_makespan(blocks: tuple[float, ...] | list[float], sends: tuple[float, ...] | list[float],
                  backward: bool = False) -> float:
    """Seconds from the ring's start to its end on one rank: step k's compute (``blocks[k]``) starts when step
    k-1's compute has ended and its send (``sends[k-1]``, the KV step k needs) has arrived; forward, send k leaves
    when send k-1 has (TE issues it on the other of its two attention streams); backward, when step k starts (its
    dKV is step k-1's output), and the ring ends when the last send (dKV home) has arrived too. So a send is
    exposed only where it is longer than the block it overlaps: with equal blocks b and sends c the forward takes
    b + (cp-1) max(b, c)."""
    start = block_end = send_end = 0.0
    for k, block in enumerate(blocks):
        start = max(block_end, send_end) if k else 0.0
        block_end = start + block
        if k < len(sends):
            send_end = (start if backward else send_end) + sends[k]
    return max(block_end, send_end) if backward else block_end


def check_context(cp: int, comm_type: CpCommType, seq_len: int, tp: int, sequence_parallel: bool, heads: int,
                  kv_heads: int, flash_attention: bool, sliding_window: bool, latent_attention: bool) -> None:
    """The rules of a context-parallel layout; a ValueError whose one line names the field and the rule."""
    if cp == 1:
        return
    if seq_len % (2 * cp):
        raise ValueError(f"parallel.cp: seq_len {seq_len} is not a multiple of 2*cp = {2 * cp} (the load-balanced "
                         "chunks, two per CP rank)")
    if sequence_parallel and (seq_len // cp) % tp:
        raise ValueError(f"parallel.cp: a rank's seq_len/cp = {seq_len // cp} tokens are not a multiple of tp = {tp} "
                         "(sequence parallelism splits them)")
    if not flash_attention:
        raise ValueError("parallel.cp: context parallelism runs Transformer Engine's fused/flash attention; set "
                         "training.flash_attention: true")
    if sliding_window:
        raise ValueError("parallel.cp: context parallelism with sliding-window attention (model.window_size) is not "
                         "modelled")
    if latent_attention:
        raise ValueError("parallel.cp: context parallelism with multi-head latent attention is not modelled")
    if comm_type == "a2a" and (heads % (tp * cp) or kv_heads % (tp * cp)):
        raise ValueError(f"parallel.cp_comm_type: a2a scatters heads over tp*cp = {tp * cp} ranks, which must divide "
                         f"model.num_attention_heads = {heads} and the kv heads = {kv_heads}")

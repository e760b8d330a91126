"""The KV buffers context parallelism allocates while a layer's attention runs (issue 24's leftover), in the memory
bound and the timeline through ``Plan.transient_bytes``: Transformer Engine's ring (``AttnFuncWithCPAndKVP2P``) keeps
every received KV block of the forward in ``p2p_comm_buffers`` and double-buffers KV + dKV in the backward; its
all-gather variant holds the gathered K, V (and in the backward their gradients) over the whole sequence."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.parallel.context import kv_bytes, ring_buffer_bytes
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.footprint import memory_plan

SCENARIO = Path(__file__).parent.parent / "scenarios" / "llama3.1-405b_h100-16384_cp16-128k.yaml"


@pytest.mark.parametrize("cp", [2, 4, 16])
def test_blocks_per_pass(cp: int) -> None:
    kv = kv_bytes(1, 8192, 128, 2)
    assert kv == 4 * 2**20  # K and V of 8,192 tokens, one 128-wide KV head per TP rank, bf16
    assert ring_buffer_bytes("p2p", cp, "forward", 1, 8192, 128, 2) == (cp - 1) * kv
    assert ring_buffer_bytes("p2p", cp, "backward", 1, 8192, 128, 2) == 4 * kv
    assert ring_buffer_bytes("all_gather", cp, "forward", 1, 8192, 128, 2) == cp * kv
    assert ring_buffer_bytes("all_gather", cp, "backward", 1, 8192, 128, 2) == 2 * cp * kv
    assert ring_buffer_bytes("a2a", cp, "backward", 1, 8192, 128, 2) == 0.0
    assert ring_buffer_bytes("p2p", 1, "backward", 1, 8192, 128, 2) == 0.0


def test_the_128k_scenario_counts_them_in_its_bound() -> None:
    # Llama 3.1 405B, 131,072 tokens over cp 16 (8,192 per rank), tp 8 (one of the 8 KV heads per TP rank):
    # all_gather holds 2 x 16 blocks of 4 MiB in the backward (128 MiB), the ring 15 in the forward (60 MiB).
    plans = {kind: resolve(load_scenario(SCENARIO, [f"parallel.cp_comm_type={kind}"]))
             for kind in ("all_gather", "p2p")}
    block = 4 * 2**20
    assert plans["all_gather"].local_seq_len == 8192
    transient = {kind: plan.transient_bytes(0) for kind, plan in plans.items()}
    assert transient["all_gather"] - transient["p2p"] == (32 - 15) * block
    bound = {kind: memory_plan(plan)[0]["activations"] for kind, plan in plans.items()}
    assert bound["all_gather"] - bound["p2p"] == (32 - 15) * block

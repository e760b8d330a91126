"""Record the per-rank order of compute chunks that DeepSeek's DualPipe and DualPipeV issue, from their own code.

In: a checkout of github.com/deepseek-ai/DualPipe (the orders in tests/data were taken at commit 3da1bbe,
"cite latest year") and a CPU build of torch; neither is needed at run or test time. Out:
``tests/data/dualpipe_orders.json``: for each (variant, ranks, micro-batches) the ordered compute chunks of every
rank, as ``DualPipe.step`` / ``DualPipeV.step`` issue them.

How: the real ``step`` method runs unchanged on an object that skips ``__init__`` (no GPU, no process group);
only the leaf methods it calls are replaced by recorders: ``_forward_chunk``, ``_backward_chunk``,
``_forward_backward_chunk``, ``_weight_chunk`` (and the p2p helpers, which only queue communication). The
recorders keep the counters the real leaf methods keep (``current_f_chunk_id``/``current_b_chunk_id`` per
phase, with ``phase ^= is_in_second_half`` in DualPipe) and WeightGradStore's FIFO of deferred weight passes.

Tokens: ``F{d}.{j}`` forward, ``B{d}.{j}`` full backward (input and weight gradients in one autograd pass,
``enable_zb=False``), ``b{d}.{j}`` input-gradient backward whose weight pass is deferred (``enable_zb=True``),
``W{d}.{j}`` a deferred weight pass (FIFO), and ``X&Y`` a forward chunk and a (full) backward chunk issued as one
overlapped pair (``_forward_backward_chunk``). ``d`` is the code's phase after the half-swap: in DualPipe the
direction (0: micro-batches entering at rank 0, 1: entering at the last rank), in DualPipeV the chunk of the V
(0: going down the ranks, 1: coming back). ``j`` counts the chunks of that phase (the micro-batch within it).

Usage: python scripts/dualpipe_reference.py PATH/TO/DualPipe > tests/data/dualpipe_orders.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

CASES = {"dualpipe": [(2, 4), (2, 6), (4, 8), (4, 10), (4, 12), (6, 12), (8, 16), (8, 20)],
         "dualpipev": [(1, 2), (2, 4), (2, 5), (3, 6), (4, 8), (4, 10), (4, 11)]}


def record(variant: str, ranks: int, chunks: int) -> list[list[str]]:
    import dualpipe.comm as comm
    import torch
    from dualpipe.dualpipe import DualPipe
    from dualpipe.dualpipev import DualPipeV

    comm.TENSOR_SHAPES, comm.TENSOR_DTYPE = [(1,)], torch.float32
    cls: Any = DualPipe if variant == "dualpipe" else DualPipeV
    orders = []
    for rank in range(ranks):
        pipe = object.__new__(cls)
        pipe.rank, pipe.num_ranks = rank, ranks
        pipe.is_first_rank, pipe.is_last_rank = rank == 0, rank == ranks - 1
        pipe.is_in_second_half = rank >= ranks // 2 if variant == "dualpipe" else False
        pipe.is_middle_rank = rank in (ranks // 2 - 1, ranks // 2)
        pipe.batch_dim = 0
        log: list[str] = []
        fifo: list[str] = []
        f_id, b_id = [0, 0], [0, 0]

        def swap(phase: int, pipe: Any = pipe) -> int:
            return phase ^ pipe.is_in_second_half

        def forward(phase: int, f_id: list[int] = f_id, swap: Any = swap) -> str:
            d = swap(phase)
            f_id[d] += 1
            return f"F{d}.{f_id[d] - 1}"

        def backward(phase: int, zb: bool, b_id: list[int] = b_id, fifo: list[str] = fifo, swap: Any = swap) -> str:
            d = swap(phase)
            b_id[d] += 1
            if zb:
                fifo.append(f"W{d}.{b_id[d] - 1}")
                return f"b{d}.{b_id[d] - 1}"
            return f"B{d}.{b_id[d] - 1}"

        pipe._forward_chunk = lambda phase, recv=True, send=True, log=log, forward=forward: log.append(forward(phase))
        pipe._backward_chunk = (lambda phase, enable_zb=False, recv=True, send=True, log=log, backward=backward:
                                log.append(backward(phase, enable_zb)))
        pipe._forward_backward_chunk = (lambda phase0, phase1, recv0=True, log=log, forward=forward, backward=backward:
                                        log.append(forward(phase0) + "&" + backward(phase1, False)))
        pipe._weight_chunk = lambda log=log, fifo=fifo: log.append(fifo.pop(0))
        for name in ("_recv_forward", "_send_forward", "_recv_backward", "_send_backward"):
            setattr(pipe, name, lambda *args, **kwargs: None)
        pipe._commit_and_wait_comm = lambda: None
        pipe._reset_states = lambda: None
        pipe.loss_chunks = [torch.zeros(())]  # what step() stacks into the loss on the end ranks
        cls.step(pipe, num_chunks=chunks, criterion=lambda *args: None)
        assert not fifo, "every deferred weight pass ran"
        orders.append(log)
    return orders


def main(checkout: str) -> None:
    sys.path.insert(0, checkout)
    out = {"source": "github.com/deepseek-ai/DualPipe @ 3da1bbe, dualpipe/dualpipe.py and dualpipev.py step(), "
                     "recorded by scripts/dualpipe_reference.py",
           "orders": {f"{variant} {ranks} {chunks}": record(variant, ranks, chunks)
                      for variant, cases in CASES.items() for ranks, chunks in cases}}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1])

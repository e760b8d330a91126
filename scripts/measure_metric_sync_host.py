"""Measure the host's time for the per-rank loops of a torchmetrics metric-state sync on one GPU.

Composer computes its model's train metrics after every batch (composer v0.17.2 ``trainer.py`` ``_train_loop`` ->
``_compute_and_log_metrics``), and torchmetrics syncs each metric state across every rank
(``torchmetrics/utilities/distributed.py`` ``gather_all_tensors`` -> ``_simple_gather_all_tensors``): a barrier,
``[torch.zeros_like(result) for _ in range(world_size)]``, then ``torch.distributed.all_gather`` into that list,
which PyTorch's ``ProcessGroupNCCL::allgather`` fills by one ``copy_`` per rank from the flattened output; the
reduction stacks the list (``torch.stack``) and sums it. Those per-rank loops run on the host with the GPU idle
(the step's loss ``.item()`` came first), so they cost world_size x (host time per entry). One GPU cannot run the
collective at 512 ranks, but the loops are local: this replays them for ``--world`` list entries, under
``torch.no_grad()`` as torchmetrics does, each repetition from an idle GPU queue.

In: ``-o FILE``, ``--world`` sizes, ``--rounds``, ``--reps``, ``--warmup``. Out: FILE, one CSV row per (round, world,
dtype, quantity), each the median over ``--reps`` of the loop's host time (time.perf_counter) divided by the world
size, in microseconds: ``zeros_like`` (the list comprehension), ``copy`` (a Python loop of
``copy_(src, non_blocking=True)`` from prebuilt source views; c10d's loop runs the same op from C++, so this bounds
it from above), ``index`` (the Python loop indexing the source alone, for reference), ``stack_sum``
(``torch.stack`` of the list and its ``sum``); a source line with torch / CUDA / the device.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--world", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()

    import torch  # deferred: only this script needs it

    device = torch.device("cuda")
    source = (f"scripts/measure_metric_sync_host.py (clustersim 2026-11-26): torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}")
    name = torch.cuda.get_device_name(device)
    rows = []
    for round_ in range(args.rounds):
        for world in args.world:
            for dtype in (torch.float32, torch.int64):  # LanguageCrossEntropy's sum_loss and total_items
                result = torch.zeros((), dtype=dtype, device=device)
                flat = torch.zeros(world, dtype=dtype, device=device)
                views = [flat[j] for j in range(world)]
                timings: dict[str, list[float]] = {"zeros_like": [], "copy": [], "index": [], "stack_sum": []}
                for rep in range(args.warmup + args.reps):
                    torch.cuda.synchronize()
                    with torch.no_grad():
                        t0 = time.perf_counter()
                        gathered = [torch.zeros_like(result) for _ in range(world)]
                        t1 = time.perf_counter()
                        for j in range(world):
                            gathered[j].copy_(views[j], non_blocking=True)
                        t2 = time.perf_counter()
                        for j in range(world):
                            flat[j]
                        t3 = time.perf_counter()
                        torch.stack(gathered).sum()
                        t4 = time.perf_counter()
                    torch.cuda.synchronize()
                    if rep >= args.warmup:
                        for quantity, start, end in (("zeros_like", t0, t1), ("copy", t1, t2), ("index", t2, t3),
                                                     ("stack_sum", t3, t4)):
                            timings[quantity].append((end - start) / world * 1e6)
                for quantity, values in timings.items():
                    row = {"source": source, "device": name, "date": "2026-11-26", "round": round_, "world": world,
                           "dtype": str(dtype).split(".")[-1], "quantity": quantity,
                           "median_us": round(statistics.median(values), 2)}
                    rows.append(row)
                    print(json.dumps(row))
    with open(args.output, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()

"""Run the microbenchmarks, fit a profile, write the files.

In: ``CalibrationOptions`` (device, quick or full sweep, output directory, processes for the collectives, the
model shape the GEMM and attention shapes come from). Out: ``gemm.csv``, ``attention.csv``, ``copy.csv``,
``collectives.csv``, ``numerics.csv`` and ``profile.json`` in the output directory, and the ``Profile``
(sim.costs.profile) returned.

On the CPU the collectives run in ``procs`` gloo processes spawned here. On GPUs, run under torchrun (one
process per GPU, ``torchrun --nproc-per-node 8 -m sim.calibrate -o DIR``): every rank joins the collectives,
rank 0 also times the GEMMs and attention kernels and writes the files. Fitting: sim.calibrate.fitting (GEMM FLOP/s
over size per dtype; attention FLOP/s over size per backend and pass; the link tier's latencies and efficiency curve
from all-reduce, all-gather and reduce-scatter).
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.calibrate.comm import OPS, bench_collectives
from sim.calibrate.compute import (
    attention_flops,
    bench_attention,
    bench_copy,
    bench_gemms,
    square_shapes,
    supports_fp8,
    transformer_shapes,
)
from sim.calibrate.fitting import Measurement, fit_link, fit_log_curve
from sim.calibrate.numerics import numerics_report
from sim.costs.profile import FORMAT, VERSION, Profile
from sim.errors import ConfigError
from sim.hardware.gpus import GPU_PRESETS
from sim.hardware.nodes import DEFAULT_NODE_FOR_GPU, NODE_PRESETS
from sim.model.presets import MODEL_PRESETS
from sim.model.transformer import ModelSpec

QUICK_MODEL = ModelSpec(name="calibration-quick", num_layers=1, hidden_size=256, num_attention_heads=4,
                        ffn_hidden_size=1024, vocab_size=1000, max_seq_len=128)


@dataclass(frozen=True)
class CalibrationOptions:
    output: Path
    device: str = "cuda"
    quick: bool = False
    procs: int = 2
    model: str | ModelSpec = "llama2-7b"
    tp: int = 1
    micro_batch: int = 1
    seq_len: int = 4096
    collectives: bool = True


def resolve_device(requested: str | None) -> str:
    """The device to calibrate on: ``requested`` (``cuda`` or ``cpu``), else ``cuda`` if torch sees a GPU, else ``cpu``.

    Raises ConfigError (one line) when torch is not installed or ``cuda`` is asked for without a GPU. Here rather
    than in the CLI because only ``sim.calibrate`` imports torch (tests/test_layering.py).
    """
    try:
        import torch
    except ImportError:
        raise ConfigError("calibrate: needs PyTorch: pip install 'clustersim[calibrate]' (or torch==2.13.0)") from None
    device = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("calibrate: --device cuda but torch sees no GPU (use --device cpu)")
    return device


def _plan(options: CalibrationOptions, device_kind: str) -> dict[str, Any]:
    if options.quick:
        return {"model": QUICK_MODEL, "seq_len": 128, "squares": [64, 128, 256], "copy": [2**20, 2**23],
                "sizes": [2**e for e in range(10, 21, 2)], "warmup": 1, "reps": 3, "comm_reps": 5,
                "dtypes": ["fp32", "bf16", "fp16"], "attention_backends": ["math"],
                "attention": [(2, 64, 32), (2, 128, 32)]}
    model = MODEL_PRESETS[options.model] if isinstance(options.model, str) else options.model
    cuda = device_kind == "cuda"
    dtypes = ["fp32", "tf32", "fp16", "bf16"] if cuda else ["fp32", "bf16"]
    # Causal attention at the model's head dimension: 8 and 32 heads (a TP rank's share of a 64-head model at tp 8,
    # and a whole 32-head one) from 1k to 32k tokens, so the two head counts overlap in FLOPs (the curve's axis).
    seqs = [2**e for e in range(10, 16)] if cuda else [256, 512]
    return {"model": model, "seq_len": options.seq_len, "squares": [2**e for e in range(8, 15)],
            "copy": [2**e for e in range(20, 31, 2)], "sizes": [2**e for e in range(10, 31)], "warmup": 5,
            "reps": 20, "comm_reps": 20, "dtypes": dtypes,
            "attention_backends": ["fused", "flash"] if cuda else ["math"],
            "attention": [(heads, seq, model.head_dim) for heads in (8, 32) for seq in seqs]}


def _gpu_preset(device_name: str) -> str | None:
    """The GPU preset whose name the CUDA device name contains (e.g. 'NVIDIA H100 80GB HBM3' -> H100-SXM)."""
    for preset in sorted(GPU_PRESETS, key=len, reverse=True):
        if preset.split("-")[0].lower() in device_name.lower():
            return preset
    return None


def device_info(device: Any) -> dict[str, Any]:
    import torch

    versions = {"torch": torch.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        versions["cuda"] = str(torch.version.cuda)
        versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            versions["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                                capture_output=True, text=True, timeout=30).stdout.split()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            versions["driver"] = "unknown"
    else:
        name = f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    return {"kind": device.type, "name": name, "versions": versions, "date": datetime.date.today().isoformat(),
            "host": platform.node()}


# The CPU collectives' rendezvous (issue 27: no listener beyond localhost): torch's TCPStore is served by this
# process on a socket bound to the loopback address before its port is handed out (``master_listen_fd``: no
# bind/close/rebind race, and the store never listens on all interfaces as an env:// rendezvous does), and gloo's
# pair sockets use the loopback interface (GLOO_SOCKET_IFNAME; by default gloo binds the address the host name
# resolves to, which may be a public one).
LOOPBACK = "127.0.0.1"


def listening_socket() -> socket.socket:
    """A TCP socket bound to ``LOOPBACK`` on a free port, already listening (the store's server takes it over)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    sock.listen()
    return sock


def loopback_interface() -> str:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), for gloo's GLOO_SOCKET_IFNAME."""
    names = [name for _, name in socket.if_nameindex()]
    return next((name for name in names if name.startswith("lo")), "lo")


def gloo_environment() -> dict[str, str]:
    """What the CPU collectives' processes set before creating their gloo process group."""
    return {"GLOO_SOCKET_IFNAME": loopback_interface()}


def _gloo_worker(rank: int, world: int, port: int, out: str, sizes: list[int], warmup: int, reps: int) -> None:
    import datetime as dt

    import torch
    import torch.distributed as dist

    os.environ.update(gloo_environment())
    store = dist.TCPStore(LOOPBACK, port, world + 1, is_master=False, timeout=dt.timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        rows = bench_collectives(torch.device("cpu"), OPS, sizes, warmup, reps)
        if rank == 0:
            pd.DataFrame(rows).to_csv(out, index=False)
    finally:
        dist.destroy_process_group()


def _cpu_collectives(options: CalibrationOptions, plan: dict[str, Any]) -> pd.DataFrame:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    out = options.output / "collectives.csv"
    sock = listening_socket()
    port = sock.getsockname()[1]
    # The store's server, here, owns the socket from now on (detach: Python must not close its descriptor too);
    # its clients are the ``procs`` workers (world_size counts this process as well).
    store = dist.TCPStore(LOOPBACK, port, options.procs + 1, is_master=True, wait_for_workers=False,
                          master_listen_fd=sock.detach())
    try:
        mp.spawn(_gloo_worker, args=(options.procs, port, str(out), plan["sizes"], 1, plan["comm_reps"]),
                 nprocs=options.procs, join=True)
    finally:
        del store
    return pd.read_csv(out)


def _torchrun_collectives(device: Any, plan: dict[str, Any]) -> pd.DataFrame:
    """Every rank measures the whole world (inter-node when it spans nodes) and, across nodes, also its own
    node's group (intra-node); rows carry a ``tier`` column."""
    import torch
    import torch.distributed as dist

    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    args = (device, OPS, plan["sizes"], plan["warmup"], plan["comm_reps"])
    rows = [{**row, "tier": "inter_node" if world > local_size else "intra_node"} for row in bench_collectives(*args)]
    if world > local_size > 1:
        groups = [dist.new_group(list(range(start, start + local_size))) for start in range(0, world, local_size)]
        mine = groups[rank // local_size]
        rows += [{**row, "tier": "intra_node"} for row in bench_collectives(*args, group=mine)]
    dist.destroy_process_group()
    return pd.DataFrame(rows)


def fit_attention(attention: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per backend, the forward and backward rate curves over the forward's counted FLOPs (knots every factor 2;
    non-decreasing, as GEMM curves: a longer sequence never runs the kernel's tiles less efficiently)."""
    curves: dict[str, dict[str, Any]] = {}
    for backend, rows in attention.groupby("backend", sort=True):
        fields: dict[str, Any] = {"head_dim": int(rows["head_dim"].max())}
        for phase, part in rows.groupby("phase"):
            # The count the cost model prices (attention_flops), from the shape and the measured time: a table
            # written under another count (the shipped sweep's 2 b h s^2 d) fits the same.
            forward_flops = pd.Series([attention_flops(int(h), int(s), int(d)) for h, s, d in
                                       zip(part["heads"], part["seq_len"], part["head_dim"], strict=True)],
                                      index=part.index)
            achieved = forward_flops * (2.0 if phase == "backward" else 1.0) / part["median_s"]
            # A knot per factor 2, placed at the median count of its rows (a causal count is 2 b h s^2 d x (n+1)/n,
            # off the powers of two the shapes sit on: a knot there would carry its rows' rate to another count,
            # 6% fast at 1k tokens)
            octave = np.round(np.log2(forward_flops.to_numpy()))
            knots = [float(np.median(forward_flops.to_numpy()[octave == e])) for e in sorted(set(octave))]
            fields[str(phase)] = [(round(x, 1), round(y, 1))
                                  for x, y in fit_log_curve(forward_flops, achieved, knots)]
        curves[str(backend)] = fields
    return curves


def fit_profile(info: dict[str, Any], gemm: pd.DataFrame, copy: pd.DataFrame, comm: pd.DataFrame | None,
                line_rates: Mapping[str, float | None], attention: pd.DataFrame | None = None) -> Profile:
    curves = {}
    for dtype, rows in gemm.groupby("dtype", sort=True):
        knots = [2.0 ** e for e in range(int(rows["flops"].min()).bit_length() - 1,
                                         int(rows["flops"].max()).bit_length() + 1)]
        peak = (rows["achieved_flops_per_s"].max() / rows["efficiency"].max()
                if rows["efficiency"].notna().any() else None)
        curves[str(dtype)] = {"rate": fit_log_curve(rows["flops"], rows["achieved_flops_per_s"], knots),
                              "peak_flops": peak}
    largest = copy[copy["bytes"] == copy["bytes"].max()]
    fields: dict[str, Any] = {"format": FORMAT, "version": VERSION, "device": info, "gemm": curves,
                              "copy_bandwidth": float(largest["bandwidth_Bps"].median()),
                              "attention": fit_attention(attention) if attention is not None and len(attention)
                              else {},
                              "source": f"sim calibrate on {info['name']}, {info['date']}"}
    if comm is not None and len(comm):
        comm = comm if "tier" in comm else comm.assign(tier="intra_node")
        for tier, part in comm.groupby("tier"):
            rows = part[part["op"].isin(["all_reduce", "all_gather", "reduce_scatter"])]
            # The tier's line rate per GPU when the device is known; else (CPU) the best busbw measured.
            rate = line_rates.get(str(tier)) or float(rows["busbw_Bps"].max())
            fit = fit_link([Measurement(r.op, int(r.n), float(r.bytes), float(r.median_s)) for r in rows.itertuples()],
                           rate, knots=[2.0 ** e for e in range(10, 33)], latency_max_bytes=16 * 1024)
            fields[str(tier)] = {"bandwidth": rate, **fit.as_link_fields()}
    return Profile.model_validate(fields)


@dataclass(frozen=True)
class Calibration:
    profile: Profile
    numerics: pd.DataFrame


def calibrate(options: CalibrationOptions) -> Calibration | None:
    """Measure, fit and write (see the module docstring); None on the torchrun ranks other than 0."""
    import torch

    device = torch.device(options.device)
    rank = int(os.environ.get("RANK", "0"))
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    options.output.mkdir(parents=True, exist_ok=True)
    plan = _plan(options, device.type)
    comm = None
    if distributed:  # torchrun: this process is one rank of the NCCL (or gloo) group
        comm = _torchrun_collectives(device, plan)
        if rank != 0:
            return None
        device = torch.device("cuda", 0) if device.type == "cuda" else device
    elif options.collectives and device.type == "cpu" and options.procs > 1:
        comm = _cpu_collectives(options, plan)
    info = device_info(device)
    preset = _gpu_preset(info["name"]) if device.type == "cuda" else None
    peaks = GPU_PRESETS[preset].peak_flops if preset else {}
    shapes = transformer_shapes(plan["model"], options.tp, options.micro_batch, plan["seq_len"]) \
        + square_shapes(plan["squares"])
    dtypes = plan["dtypes"] + (["fp8"] if supports_fp8(device) and not options.quick else [])
    gemm = pd.DataFrame([row for dtype in dtypes
                         for row in bench_gemms(device, dtype, shapes, plan["warmup"], plan["reps"], peaks.get(dtype))])
    attention = pd.DataFrame(bench_attention(device, plan["attention_backends"], plan["attention"], plan["warmup"],
                                             plan["reps"]))
    copy = pd.DataFrame(bench_copy(device, plan["copy"], plan["warmup"], plan["reps"]))
    numerics = pd.DataFrame(numerics_report())
    node = NODE_PRESETS[DEFAULT_NODE_FOR_GPU[preset]] if preset else None
    # Inter-node: every GPU's ring leaves over its own NIC (one per GPU on the DGX presets).
    lines = {} if node is None else {"intra_node": node.intra_node.bandwidth,
                                     "inter_node": node.inter_node.bandwidth * node.nics_per_node / node.gpus_per_node}
    measured = fit_profile(info, gemm, copy, comm, lines, attention)
    for name, frame in (("gemm", gemm), ("attention", attention), ("copy", copy), ("numerics", numerics)):
        frame.to_csv(options.output / f"{name}.csv", index=False)
    if comm is not None:
        comm.to_csv(options.output / "collectives.csv", index=False)
    (options.output / "profile.json").write_text(measured.model_dump_json(indent=1) + "\n")
    return Calibration(measured, numerics)

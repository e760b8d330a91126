"""Planning figures of a simulated step: what training on a token budget takes in time, GPU-hours, energy and
money.

In: the step time, the GPUs, the tokens a step trains on, the compute stream's busy fraction (from the trace), the
GPU's board power (``GpuSpec.board_power``), and the scenario's optional ``training.train_tokens`` and
``cluster.price_per_gpu_hour``. Out: a ``Planning`` record, summary.json's ``planning`` object (docs/summary.md),
its budget figures null without a budget.

Energy model (GPUs only): a GPU draws its board power (NVIDIA's TDP, AMD's TBP) while its compute stream runs a
kernel and nothing otherwise, so power = board power x utilisation, utilisation = the fraction of the step a
rank's compute stream is busy, averaged over the simulated ranks. Under sustained GEMM load training GPUs run near
their power limit (the reason the limit is the figure to scale), and the idle draw it leaves out is small beside
it; host CPUs, NICs, switches and cooling (the data centre's PUE) are not counted. So the figure is the GPUs'
share of the facility's energy, not its meter reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

J_PER_KWH = 3.6e6
S_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Planning:
    """summary.json's ``planning``: per-step power and energy, and with a token budget the steps, time, GPU-hours,
    energy and cost of training on it (None without a budget, cost None without a price, energy None without
    the GPU's board power)."""

    compute_utilization: float  # fraction of the step the compute stream is busy, mean over simulated ranks
    power_w: float | None  # all GPUs' mean draw over the step
    energy_per_step_j: float | None
    train_tokens: float | None
    train_steps: int | None  # ceil(train_tokens / tokens per step)
    time_to_train_s: float | None
    gpu_hours: float | None
    energy_kwh: float | None
    price_per_gpu_hour: float | None
    cost: float | None  # gpu_hours x price_per_gpu_hour


def planning(step_time_s: float, num_gpus: int, tokens_per_step: float, compute_utilization: float,
             board_power_w: float | None, train_tokens: float | None,
             price_per_gpu_hour: float | None) -> Planning:
    """The ``Planning`` of one step's figures (see the module docstring for the energy model)."""
    power = None if board_power_w is None else board_power_w * num_gpus * compute_utilization
    energy_step = None if power is None else power * step_time_s
    steps = time_s = gpu_hours = energy_kwh = cost = None
    if train_tokens is not None:
        steps = math.ceil(train_tokens / tokens_per_step)
        time_s = steps * step_time_s
        gpu_hours = num_gpus * time_s / S_PER_HOUR
        energy_kwh = None if energy_step is None else steps * energy_step / J_PER_KWH
        cost = None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour
    return Planning(compute_utilization=compute_utilization, power_w=power, energy_per_step_j=energy_step,
                    train_tokens=train_tokens, train_steps=steps, time_to_train_s=time_s, gpu_hours=gpu_hours,
                    energy_kwh=energy_kwh, price_per_gpu_hour=price_per_gpu_hour, cost=cost)

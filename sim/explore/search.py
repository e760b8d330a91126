"""Search the layout space of one model on one cluster: screen every layout analytically, simulate the best.

In: a base scenario (model, cluster, global batch, sequence length, dtype, costs, network) and the knobs to
explore. Out: ``screen`` -> a DataFrame with one row per candidate layout (tp, pp, dp, vpp, micro-batch,
schedule, ZeRO stage, recompute, sequence parallel): ``status`` (``ok``, ``oom``: over HBM by the memory
bound, ``invalid: <rule>``), the closed-form step time, MFU and peak memory (sim.explore.estimate) and a lower bound on
the step (every stage must run its micro-batches' work one after another: m x the slowest stage's F+B+W).
``to_points`` turns the best screened layouts into sweep points (dotted keys) that ``sim.explore.sweep`` simulates on
any executor, resumably; ``prune`` drops those whose lower bound cannot beat the best simulated step so far.
``run_search`` does all of it: ``DIR/screen.parquet`` (every layout), ``DIR/results.csv|parquet`` (simulated).

The space (Megatron-LM's knobs, Narayanan et al. SC21 Sec. 3): tp over the divisors of a node's GPUs that divide the
heads and the FFN; pp over the divisors of the layer count (or of the split the base sets: ``pipeline_splits``); dp
the rest; micro-batch sizes whose count divides the global batch; every schedule (interleaved with each vpp that
divides the layers per stage); ZeRO 0-3 (with pp > 1,
stages 2 and 3 are PyTorch FSDP's SHARD_GRAD_OP and FULL_SHARD as TorchTitan runs them under a pipeline,
``Plan.pipelined_fsdp``: DeepSpeed refuses ZeRO-2/3 with its pipeline engine); recompute none / selective / full;
sequence parallel on or off when tp > 1; for a MoE model, etp over the divisors of tp and ep over the divisors of
the expert count with ep*etp dividing tp*dp (Megatron-Core's MoE parallel folding; tp*cp*dp with context
parallelism); cp with each cp_comm_type where each rank keeps at least ``CP_MIN_LOCAL_TOKENS`` tokens
(``context_degrees``). Validity uses the scenario rules of sim.spec.scenario, so a layout the search keeps is one
``sim run`` accepts. ``parse_only`` narrows the space to what a framework offers (``--only zero=0``: Megatron-LM
before its distributed optimizer; ``--only schedule=1f1b,interleaved``: no zero-bubble schedules).

The search is one module per part: the knobs and the layout space (``search_space``), a layout's scenario and cache keys
(``search_candidate``), the pricing loop in one process (``search_screen``) and shared out over forked processes
(``search_processes``); here the screen put together, the best layouts simulated (``run_search``). Their public names
are this module's too.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import ConfigError, SimError
from sim.explore import layout_table
from sim.explore.estimate import Estimator
from sim.explore.executors import DASK_TIMEOUT_S, Executor
from sim.explore.search_candidate import Sections, candidate, layout_fsdp, layout_keys
from sim.explore.search_processes import _screen_in_processes, _usable_cpus
from sim.explore.search_screen import SCREEN_PROGRESS_EVERY, _screen_columns
from sim.explore.search_space import (
    CP_COMM_TYPES,
    CP_MIN_LOCAL_TOKENS,
    LAYOUT_FIELDS,
    LAYOUT_KEYS,
    RECOMPUTE_MODES,
    SEARCHED_SCHEDULES,
    Layout,
    Only,
    context_degrees,
    expert_degrees,
    layouts,
    parse_only,
    pipeline_splits,
)
from sim.explore.sweep import RESULTS_CSV, SweepSpec, point_id, run_sweep
from sim.output.atomic import write_atomically
from sim.spec.degrees import degrees
from sim.spec.scenario import FsdpSpec, Scenario, load_scenario
from sim.workload.size import Limits

__all__ = ["CP_COMM_TYPES", "CP_MIN_LOCAL_TOKENS", "LAYOUT_FIELDS", "LAYOUT_KEYS", "Layout", "Only", "RECOMPUTE_MODES",
           "SCREEN_PARALLEL_MIN", "SCREEN_PROGRESS_EVERY", "SEARCHED_SCHEDULES", "SearchResult", "Sections", "best",
           "candidate", "context_degrees", "expert_degrees", "layout_fsdp", "layout_keys", "layout_of", "layouts",
           "none_fits", "parse_only", "pipeline_splits", "prune", "run_search", "screen", "to_points"]


# Below this many layouts the screen runs in this process whatever ``jobs`` says: starting the processes and
# sending the rows back would cost more than the pricing.
SCREEN_PARALLEL_MIN = 2000


def screen(base: Scenario, space: list[Layout], estimator: Estimator | None = None,
           on_progress: Callable[[int, int], None] | None = None, jobs: int = 1) -> pd.DataFrame:
    """One row per layout: status, estimated step time / MFU / peak memory, and the step's lower bound.
    ``on_progress(done, total)`` is called every ``SCREEN_PROGRESS_EVERY`` layouts (with ``jobs`` > 1, whenever
    a process reports that many more) and at the end. ``jobs``: processes that price the layouts
    (``_screen_in_processes``); every row is the one the screen gives in this process."""
    estimator = estimator or Estimator(base)
    jobs = min(jobs, _usable_cpus())  # a Dask cluster's worker count need not fit this machine
    values, codes = layout_table.columns(space, LAYOUT_FIELDS)  # the table's layout columns, the rules' codes
    if jobs > 1 and len(space) >= SCREEN_PARALLEL_MIN and "fork" in multiprocessing.get_all_start_methods() \
            and not multiprocessing.current_process().daemon:  # a daemonic process may not start processes
        status, estimates = _screen_in_processes(base, space, estimator, on_progress, jobs, codes)
    else:
        status, estimates = _screen_columns(base, space, estimator, on_progress, codes)
    table = pd.DataFrame(values | {"status": status} | estimates)
    return table.sort_values(["status", "est_step_time_s"], key=lambda col: col if col.name != "status" else
                             col.ne("ok"), kind="stable").reset_index(drop=True)


def none_fits(base: Scenario, screened: pd.DataFrame, where: Path) -> str:
    """The one line a search whose screen kept no layout ends with: how many layouts ran out of memory, the one
    that needs least (its estimated peak against the GPU's memory) and where every screened row is."""
    gib = 2.0 ** 30
    statuses = screened["status"].value_counts()
    counts = ", ".join(f"{count} {status}" for status, count in statuses.items())
    line = (f"search: no layout of {base.model.name} fits on {base.cluster.num_gpus} x {base.cluster.gpu.name} "
            f"({len(screened)} screened: {counts})")
    priced = screened[screened["est_peak_memory_bytes"] > 0]
    if len(priced):
        least = priced.loc[priced["est_peak_memory_bytes"].idxmin()]
        knobs = " ".join(f"{name} {_native(least[name])}" for name in ("tp", "pp", "dp", "micro_batch", "recompute",
                                                                         "zero") if name in least.index)
        line += (f"; the least memory is {least['est_peak_memory_bytes'] / gib:.1f} GiB of "
                 f"{least['hbm_capacity_bytes'] / gib:.1f} GiB ({knobs})")
    return line + f"; every layout is in {where}"


def best(table: pd.DataFrame, top: int) -> pd.DataFrame:
    """The ``top`` layouts that fit, fastest estimate first."""
    return table[table["status"] == "ok"].head(top)


def layout_of(row: pd.Series) -> Layout:
    """The layout of one screened row."""
    return Layout(**{name: _native(row[name]) for name in LAYOUT_KEYS})


def to_points(rows: pd.DataFrame, base_fsdp: FsdpSpec | None = None) -> list[dict[str, Any]]:
    """The rows' layouts as sweep points (``Layout.point``; ``base_fsdp``: the base scenario's fsdp section)."""
    return [layout_of(row).point(base_fsdp) for _, row in rows.iterrows()]


def _native(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def prune(rows: pd.DataFrame, best_simulated: float) -> pd.DataFrame:
    """Rows whose lower bound can still beat the best simulated step time."""
    return rows[rows["bound_step_time_s"] < best_simulated]


@dataclass
class SearchResult:
    screened: pd.DataFrame  # every layout, with status (ok / oom / invalid / pruned) and the estimate
    simulated: pd.DataFrame  # the layouts confirmed by event simulation (the sweep's results table)
    screen_s: float
    simulate_s: float


def run_search(base_path: Path, overrides: list[str], out: Path, top: int = 1000, jobs: int = 1,
               executor: Executor = "process", scheduler: str | None = None, use_bound: bool = True,
               on_row: Callable[[dict[str, Any]], None] | None = None, only: Only | None = None,
               dask_timeout: float = DASK_TIMEOUT_S, limits: Limits | None = None,
               on_dashboard: Callable[[str], None] | None = None,
               on_screen: Callable[[int, int], None] | None = None) -> SearchResult:
    """Screen the whole space (or the part ``only`` allows), then simulate the ``top`` layouts in waves of best
    estimates first; with ``use_bound`` a layout whose lower bound cannot beat the best simulated step is
    skipped (``pruned``). ``dask_timeout``: seconds the Dask executor waits to connect to its scheduler; ``limits``:
    each simulated layout's run budget (``sim.workload.size``); ``on_dashboard``: the Dask dashboard's link, when
    one is wanted (each wave's sweep reports it); ``on_screen(done, total)``: the screen's progress (``screen``'s
    ``on_progress``), ``on_row``: each simulated layout's row."""
    began = time.perf_counter()
    base = load_scenario(base_path, overrides)
    space = list(layouts(base, only))
    if not space:
        raise ConfigError(f"--only: no layout of {base.model.name} on {base.cluster.num_gpus} GPUs has "
                          + " and ".join(f"{knob} in {sorted(values)}" for knob, values in (only or {}).items()))
    screened = screen(base, space, on_progress=on_screen, jobs=jobs)
    out.mkdir(parents=True, exist_ok=True)
    screen_s = time.perf_counter() - began
    chosen = best(screened, top)
    if chosen.empty:  # nothing to simulate: keep the screen, say what came closest
        write_atomically(out / "screen.parquet", lambda path: screened.to_parquet(path, index=False))
        raise SimError(none_fits(base, screened, out / "screen.parquet"))
    # Without an fsdp section in the base, each point names the FSDP + PP one it needs; with one, the points keep
    # its knobs (candidate's layout_fsdp)
    fixed = [f"training.global_batch={degrees(base).global_batch}", "training.microbatches=null"]
    fixed += ["fsdp=null"] if base.fsdp is None else []
    points = to_points(chosen, base.fsdp)
    spec = SweepSpec(base_path, {}, overrides + fixed, explicit=points)
    ours = {point_id(point) for point in points}  # a resumed directory may hold layouts an earlier --only searched
    # Waves let the bound prune with the best step found so far; without it, one batch keeps the workers busy.
    wave = max(32, 16 * jobs) if use_bound else max(1, len(chosen))
    best_step, pruned = float("inf"), []
    rows = chosen.reset_index(drop=True)
    for first in range(0, len(rows), wave):
        batch = rows.iloc[first:first + wave]
        keep = prune(batch, best_step) if use_bound else batch
        pruned += [i for i in batch.index if i not in keep.index]
        table = run_sweep(spec, out, jobs, on_row=on_row, executor=executor, scheduler=scheduler,
                          only=set(int(i) for i in keep.index), dask_timeout=dask_timeout, limits=limits,
                          on_dashboard=on_dashboard)
        done = table[(table["status"] == "ok") & table["point_id"].isin(ours)]
        if len(done):
            best_step = min(best_step, float(done["step_time_s"].min()))
    simulated = pd.read_csv(out / RESULTS_CSV)
    simulated = simulated[simulated["point_id"].isin(ours)]
    simulated = simulated.sort_values("step_time_s", kind="stable").reset_index(drop=True)
    chosen_index = chosen.index.to_numpy()
    screened.loc[chosen_index[pruned], "status"] = "pruned"
    write_atomically(out / "screen.parquet", lambda path: screened.to_parquet(path, index=False))
    write_atomically(out / "results.parquet", lambda path: simulated.to_parquet(path, index=False))
    return SearchResult(screened, simulated, screen_s, time.perf_counter() - began - screen_s)

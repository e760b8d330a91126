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
"""

from __future__ import annotations

import gc
import itertools
import math
import multiprocessing
import multiprocessing.connection
import operator
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
from pydantic import BaseModel

from sim.errors import ConfigError, SimError
from sim.explore import layout_table
from sim.explore.estimate import PRICED_AS, Estimator, LayoutKeys
from sim.explore.executors import DASK_TIMEOUT_S, Executor
from sim.explore.sweep import RESULTS_CSV, SweepSpec, parse_axis, point_id, run_sweep
from sim.output.atomic import write_atomically
from sim.parallel.schedules import SCHEDULES
from sim.spec.degrees import Degrees, degrees, pipeline_slots
from sim.spec.scenario import FsdpSpec, Scenario, check_rules, load_scenario
from sim.workload.size import Limits

LAYOUT_KEYS = {"tp": "parallel.tp", "pp": "parallel.pp", "dp": "parallel.dp", "vpp": "parallel.vpp",
               "micro_batch": "training.micro_batch", "schedule": "schedule", "zero": "parallel.zero",
               "recompute": "training.recompute", "sequence_parallel": "parallel.sequence_parallel",
               "ep": "parallel.ep", "etp": "parallel.etp", "cp": "parallel.cp", "cp_comm_type": "parallel.cp_comm_type"}
LAYOUT_FIELDS = tuple(LAYOUT_KEYS)
RECOMPUTE_MODES = ("none", "selective", "full")
CP_COMM_TYPES = ("p2p", "all_gather", "a2a")
# Context parallelism is searched where each rank keeps at least this many tokens of a sequence: NVIDIA's NeMo
# recipes switch it on from 8K sequences with cp 2 (Llama 3 8B/70B at 8K: 4,096 tokens per rank), and shorter
# chunks leave ring attention's blocks too short to hide their sends. ``--only cp=...`` overrides it.
CP_MIN_LOCAL_TOKENS = 4096


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    vpp: int
    micro_batch: int
    schedule: str
    zero: int
    recompute: str
    sequence_parallel: bool
    ep: int = 1  # expert parallel (MoE models; 1 for dense ones)
    etp: int = 1  # expert tensor parallel (MoE models; 1 for dense ones)
    cp: int = 1  # context parallel
    cp_comm_type: str = "p2p"

    @property
    def fsdp_sharding(self) -> str | None:
        """With a pipeline, ZeRO-2/3 is FSDP (SHARD_GRAD_OP / FULL_SHARD; DeepSpeed's pipeline engine refuses them);
        None where ``parallel.zero`` alone says it."""
        return _SHARDING.get(self.zero) if self.pp > 1 else None

    def point(self, base_fsdp: FsdpSpec | None = None) -> dict[str, Any]:
        """The layout as sweep overrides (dotted scenario keys), with ``fsdp.sharding`` for FSDP + PP. With
        ``base_fsdp``, the base scenario's fsdp section, the overrides keep that section's knobs as ``candidate``
        does (``layout_fsdp``): dropped below ZeRO-2, its sharding the layout's ZeRO stage's where they differ."""
        point = {LAYOUT_KEYS[name]: value for name, value in asdict(self).items()}
        if base_fsdp is None:
            return point | ({"fsdp.sharding": self.fsdp_sharding} if self.fsdp_sharding else {})
        sharding = _SHARDING.get(self.zero)
        if sharding is None:
            return point | {"fsdp": None}
        if base_fsdp.zero_stage == self.zero:
            return point
        return point | {"fsdp.sharding": sharding} | (
            {"fsdp.reshard_after_forward": None} if sharding == "SHARD_GRAD_OP" else {})


Only = Mapping[str, frozenset[Any]]  # knob -> the values the search may use


def parse_only(specs: list[str]) -> Only:
    """``["zero=0,1", "tp=4..8"]`` (values read as ``--grid`` reads them) -> the allowed values per knob;
    ConfigError naming the bad part."""
    only: dict[str, frozenset[Any]] = {}
    for spec in specs:
        knob, _, values = spec.partition("=")
        if knob.strip() not in LAYOUT_KEYS or not values.strip():
            raise ConfigError(f"--only {spec!r}: expected KNOB=v1,v2 with KNOB one of {', '.join(LAYOUT_KEYS)}")
        try:
            knob, parsed = parse_axis(spec)
        except ConfigError:
            raise ConfigError(f"--only {spec!r}: a range a..b needs integers") from None
        only[knob] = frozenset(_checked(knob, value) for value in parsed)
    return only


# DualPipe and DualPipeV are left out of the search: their two model copies (DualPipe) or V (DualPipeV) change the
# memory and the step in ways the screen's closed forms do not price beyond a stage-level replay.
SEARCHED_SCHEDULES = tuple(name for name in SCHEDULES if not name.startswith("dualpipe"))
_CHOICES: dict[str, tuple[Any, ...]] = {"schedule": SEARCHED_SCHEDULES, "recompute": RECOMPUTE_MODES,
                                        "zero": (0, 1, 2, 3), "sequence_parallel": (True, False),
                                        "cp_comm_type": CP_COMM_TYPES}


def _checked(knob: str, value: Any) -> Any:
    choices = _CHOICES.get(knob)
    if choices is None:  # a degree or a micro-batch size
        if type(value) is not int or value < 1:
            raise ConfigError(f"--only {knob}: {value!r} is not a positive integer")
    elif type(value) is not type(choices[0]) or value not in choices:  # type(): True is not ZeRO stage 1
        raise ConfigError(f"--only {knob}: {value!r} is not one of {', '.join(map(str, choices))}")
    return value


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def expert_degrees(base: Scenario, tp: int, dp: int) -> list[tuple[int, int]]:
    """(ep, etp) of a MoE model on a stage of tp*dp ranks: etp over the divisors of tp that divide the expert FFN,
    ep over the divisors of the expert count with ep*etp dividing tp*dp; [(1, 1)] for a dense model."""
    model = base.model
    if model.num_moe_experts is None:
        return [(1, 1)]
    return [(ep, etp) for etp in _divisors(tp) if model.moe_ffn % etp == 0
            for ep in _divisors(model.num_moe_experts) if (tp * dp) % (ep * etp) == 0]


def context_degrees(base: Scenario, ranks: int, only: Only | None = None) -> list[tuple[int, str]]:
    """(cp, cp_comm_type) over ``ranks`` GPUs left by tp x pp: cp 1, and each divisor of ``ranks`` that splits the
    sequence into 2 x cp chunks and leaves every rank ``CP_MIN_LOCAL_TOKENS`` tokens (any divisor ``--only cp``
    names), with each communication type (the rules refuse a2a where tp x cp does not divide the heads)."""
    seq_len = degrees(base).seq_len
    allowed = only.get("cp") if only else None
    out = [(1, "p2p")]
    for cp in _divisors(ranks)[1:]:
        if seq_len % (2 * cp) or (seq_len // cp < CP_MIN_LOCAL_TOKENS if allowed is None else cp not in allowed):
            continue
        out += [(cp, comm) for comm in CP_COMM_TYPES]
    return out


def pipeline_splits(base: Scenario) -> dict[int, int]:
    """The pipeline degrees the base's layer split allows, each with the layer count every stage's share must be
    divisible by for its vpp chunks: the layers over pp (pp over the divisors of the layer count); with
    Megatron-Core's --account-for-embedding/loss-in-pipeline-split, the layers plus those slots
    (``pipeline_slots``); with ``first_stage_layers`` / ``last_stage_layers``, the remaining layers over the other
    stages, and vpp dividing the first, the last and a middle stage's count (sim.spec.rules checks the same)."""
    p, layers = base.parallel, base.model.num_layers
    if p.first_stage_layers is None and p.last_stage_layers is None:
        total = layers + pipeline_slots(base)
        return {pp: total // pp for pp in _divisors(total)}
    given = [count for count in (p.first_stage_layers, p.last_stage_layers) if count is not None]
    rest = layers - sum(given)
    if rest <= 0:
        return {len(given): math.gcd(*given)} if rest == 0 else {}
    return {len(given) + others: math.gcd(rest // others, *given) for others in _divisors(rest)}


def layouts(base: Scenario, only: Only | None = None, max_micro_batch: int = 16) -> Iterator[Layout]:
    """Every combination of the knobs (those in ``only`` limited to its values); rule checks come later."""
    implied = degrees(base)
    gpus, model, global_batch = implied.num_gpus, base.model, implied.global_batch
    chunk_layers = pipeline_splits(base)
    stage_counts = sorted(chunk_layers)
    for tp in _divisors(base.cluster.gpus_per_node):
        if model.num_attention_heads % tp or model.ffn % tp or model.kv_heads % tp:
            continue
        for pp, (cp, comm) in ((p, c) for p in stage_counts if gpus % (tp * p) == 0
                               for c in context_degrees(base, gpus // (tp * p), only)):
            dp = gpus // (tp * pp * cp)
            if global_batch % dp:
                continue
            for mb in _divisors(global_batch // dp):
                if mb > max_micro_batch:
                    break
                for schedule in (SEARCHED_SCHEDULES if pp > 1 else ("1f1b",)):
                    vpps = [v for v in _divisors(chunk_layers[pp]) if v > 1] if schedule == "interleaved" \
                        else [2] if schedule == "zb-v" else [1]
                    for vpp, zero, rc, sp, (ep, etp) in itertools.product(vpps, (0, 1, 2, 3), RECOMPUTE_MODES,
                                                                          (False, True) if tp > 1 else (False,),
                                                                          expert_degrees(base, tp, cp * dp)):
                        if zero >= 2 and pp > 1 and cp * dp == 1:  # FSDP over one rank: nothing to shard (ZeRO-0's)
                            continue
                        layout = Layout(tp, pp, dp, vpp, mb, schedule, zero, rc, sp, ep, etp, cp, comm)
                        if not only or all(getattr(layout, knob) in values for knob, values in only.items()):
                            yield layout


def candidate(base: Scenario, layout: Layout, global_batch: int | None = None,
              sections: Sections | None = None) -> Scenario:
    """The base scenario with this layout (no re-validation of the unchanged fields); ValueError if a rule fails.
    ``global_batch``: the base's (``degrees(base).global_batch``), where the caller has it. ``sections``: where
    the caller screens many layouts of this base, a dict in which the parallel and training sections (frozen)
    are kept for the layouts that set them alike (one parallel section serves every micro-batch size, schedule
    and recomputation)."""
    return _checked_candidate(base, layout, global_batch, sections)[0]


def _checked_candidate(base: Scenario, layout: Layout, global_batch: int | None = None,
                       sections: Sections | None = None) -> tuple[Scenario, Degrees]:
    """``candidate``'s scenario and the degrees its rules checked (``check_rules``), which its plan keeps."""
    scenario = _candidate_scenario(base, layout, global_batch, sections)
    return scenario, check_rules(scenario)


def _candidate_scenario(base: Scenario, layout: Layout, global_batch: int | None = None,
                        sections: Sections | None = None) -> Scenario:
    """``candidate``'s scenario, its rules not checked."""
    degrees_ = (layout.tp, layout.pp, layout.dp, layout.vpp, layout.zero, layout.sequence_parallel, layout.ep,
                layout.etp, layout.cp, layout.cp_comm_type)
    parallel = _section(base, "parallel", degrees_, lambda: {
        "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "vpp": layout.vpp, "zero": layout.zero,
        "sequence_parallel": layout.sequence_parallel, "ep": layout.ep, "etp": layout.etp, "cp": layout.cp,
        "cp_comm_type": layout.cp_comm_type}, sections)
    batch = degrees(base).global_batch if global_batch is None else global_batch
    training = _section(base, "training", (layout.micro_batch, layout.recompute, batch), lambda: {
        "micro_batch": layout.micro_batch, "recompute": layout.recompute, "microbatches": None,
        "global_batch": batch}, sections)
    return _updated(base, {"parallel": parallel, "training": training, "schedule": layout.schedule,
                           "fsdp": layout_fsdp(base, layout)})


_Spec = TypeVar("_Spec", bound=BaseModel)
Sections = dict[tuple[str, tuple[Any, ...]], Any]  # a base's sections copied for layouts (candidate's sections)


def _section(base: Scenario, name: str, key: tuple[Any, ...], update: Callable[[], dict[str, Any]],
             sections: Sections | None) -> Any:
    """``base``'s section ``name`` with ``update()``; with ``sections``, one copy per ``key`` (what the update
    sets) kept there."""
    if sections is None:
        return _updated(getattr(base, name), update())
    found = sections.get((name, key))
    if found is None:
        found = sections[name, key] = _updated(getattr(base, name), update())
    return found


def _updated(spec: _Spec, update: dict[str, Any]) -> _Spec:
    """``spec.model_copy(update=update)`` (no validation) without pydantic's generic copy, for the specs of a
    candidate: frozen, so the copy may share the unchanged values; the fields set gain the update's names.
    The generic copy where a spec carries extra or private state."""
    if spec.__pydantic_extra__ is not None or spec.__pydantic_private__ is not None:
        return spec.model_copy(update=update)
    copied = object.__new__(type(spec))
    object.__setattr__(copied, "__dict__", spec.__dict__ | update)
    object.__setattr__(copied, "__pydantic_extra__", None)
    object.__setattr__(copied, "__pydantic_private__", None)
    object.__setattr__(copied, "__pydantic_fields_set__", spec.__pydantic_fields_set__ | update.keys())
    return copied


_SHARDING = {2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}  # the FSDP sharding of a ZeRO stage
_FSDP: dict[str, FsdpSpec] = {}
_FSDP_LIKE: dict[tuple[int, str], tuple[FsdpSpec, FsdpSpec]] = {}


def layout_fsdp(base: Scenario, layout: Layout) -> FsdpSpec | None:
    """The fsdp section of ``candidate(base, layout)``. Without one in the base: ZeRO-2/3 under a pipeline is FSDP
    (``Layout.fsdp_sharding``), else none. With one, its knobs (version, prefetch, reshard_after_forward,
    unit_layers) are what the user runs, so they stay: the base's section where its ZeRO stage is the layout's
    (HYBRID_SHARD included), its sharding replaced by the layout's ZeRO stage's otherwise (reshard_after_forward
    back to its default under SHARD_GRAD_OP, which refuses true), none below ZeRO-2 (a candidate's rules then
    refuse what contradicts, e.g. FULL_SHARD without resharding at ZeRO-3)."""
    sharding = _SHARDING.get(layout.zero)
    if sharding is None:
        return None
    if base.fsdp is None:
        return _fsdp(sharding) if layout.pp > 1 else None
    if base.fsdp.zero_stage == layout.zero:
        return base.fsdp
    key = (id(base.fsdp), sharding)
    found = _FSDP_LIKE.get(key)
    if found is None or found[0] is not base.fsdp:  # the base kept beside its copy, so its id stays its own
        update: dict[str, Any] = {"sharding": sharding}
        if sharding == "SHARD_GRAD_OP":
            update["reshard_after_forward"] = None
        found = _FSDP_LIKE[key] = (base.fsdp, FsdpSpec.model_validate(base.fsdp.model_dump() | update))
    return found[1]


def _fsdp(sharding: str) -> FsdpSpec:
    """The FSDP section of a layout with this sharding (a frozen spec, so its candidates share one)."""
    if sharding not in _FSDP:
        _FSDP[sharding] = FsdpSpec.model_validate({"sharding": sharding})
    return _FSDP[sharding]


def layout_keys(base: Scenario, layout: Layout) -> LayoutKeys:
    """The estimator's cache keys of ``candidate(base, layout)``, from the layout's fields (a candidate differs from
    its base in them alone, so the base's identity stands for the rest; the base, kept with the cached parts,
    stays alive): ``stages`` without the ZeRO stage but with the FSDP section it implies (none under a pipeline)
    and with the schedule the estimate prices it as (``PRICED_AS``: GPipe as 1F1B), ``activations`` without
    the ZeRO stage and FSDP, ``structure`` the pipeline's alone (what each stage holds, recomputes, offloads and
    sends does not depend on tp, cp, dp, the micro-batch size, SP or ZeRO), ``shape`` without the micro-batch size,
    recomputation and SP, and with the schedule's chunk placement (``Schedule.layout``) for its name: a stage's
    gradients, buckets, optimizer and resident memory follow from which layers it holds, not from the order its
    passes run in (GPipe, 1F1B, ZB-H1 and ZB-H2 share them), ``layer`` what one layer's times depend on: its work
    and its TP, CP and expert collectives (on rank 0's groups, whatever pp), whether the schedule splits the
    backward, and the micro-batches (dp, through MoE's token counts), ``stash`` ``activations`` with the chunk
    placement for the schedule's name (a chunk's stash does not depend on the order its passes run in)."""
    degrees_ = (layout.tp, layout.pp, layout.dp, layout.vpp)
    rest = (layout.ep, layout.etp, layout.cp, layout.cp_comm_type)
    activations = (id(base), *degrees_, layout.schedule, *rest, layout.micro_batch, layout.recompute,
                   layout.sequence_parallel)
    shape = (id(base), *degrees_, SCHEDULES[layout.schedule].layout, *rest, layout.zero)
    structure = (id(base), layout.pp, layout.vpp, layout.schedule, layout.recompute)
    layer = (id(base), layout.tp, layout.dp, *rest, layout.micro_batch, layout.recompute, layout.sequence_parallel,
             SCHEDULES[layout.schedule].splits_backward)
    # FSDP's gathers, and FSDP1's gradient kernels in a layer's times; but under a pipeline a layout's FSDP section
    # is FSDP + PP (Plan.pipelined_fsdp: gathered once per step, no per-micro-batch gradient kernels), which
    # changes neither a layer's times nor a stage's per micro-batch, so ZeRO-2/3 share ZeRO-0/1's
    fsdp = id(layout_fsdp(base, layout)) if layout.pp == 1 else None
    stash = (id(base), *degrees_, SCHEDULES[layout.schedule].layout, *rest, layout.micro_batch, layout.recompute,
             layout.sequence_parallel)
    times = (id(base), *degrees_, PRICED_AS.get(layout.schedule, layout.schedule), *rest, layout.micro_batch,
             layout.recompute, layout.sequence_parallel, fsdp)  # GPipe's stage times and pipeline are 1F1B's
    return LayoutKeys(times, shape, activations, structure, layer + (fsdp,), (id(base),), base,
                      stash)


# A scenario field a layout sets from some of its knobs -> those knobs: the fsdp section (``layout_fsdp``)
_DERIVED = {"fsdp": ("zero", "pp")}
SCREEN_PROGRESS_EVERY = 1000  # layouts between two calls of screen's on_progress
# Below this many layouts the screen runs in this process whatever ``jobs`` says: starting the processes and
# sending the rows back would cost more than the pricing.
SCREEN_PARALLEL_MIN = 2000
_ESTIMATE_COLUMNS = ("est_step_time_s", "est_mfu", "est_peak_memory_bytes", "bound_step_time_s", "microbatches",
                     "hbm_capacity_bytes")
_Columns = tuple[list[str], dict[str, list[Any]]]  # each layout's status, and the estimate's columns


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


def _screen_columns(base: Scenario, space: list[Layout], estimator: Estimator,
                    on_progress: Callable[[int, int], None] | None = None,
                    codes: layout_table.Codes | None = None) -> _Columns:
    """Each layout's status and estimate columns (NaN where it is invalid), in the order of ``space``. ``codes``:
    the layout columns' codes (``layout_table.columns``), where the caller has them."""
    global_batch = degrees(base).global_batch
    hbm = base.cluster.gpu.hbm_capacity
    status: list[str] = []
    # the estimate's columns, NaN where a layout is invalid
    estimates: dict[str, list[Any]] = {name: [] for name in _ESTIMATE_COLUMNS}
    # The pricing allocates millions of short-lived tuples and floats and frees them by reference counting; the
    # cyclic collector, run every 700 allocations, would traverse them and every cached part (10-15% of the 175B
    # screen's CPU, 2026-11-26). It is paused for the loop (the loop's few cycles are collected after it).
    collecting = gc.isenabled()
    gc.disable()
    try:
        if codes is None:
            codes = layout_table.columns(space, LAYOUT_FIELDS)[1]
        _price_layouts(base, space, estimator, on_progress, global_batch, hbm, status, estimates, codes)
    finally:
        if collecting:
            gc.enable()
    if on_progress is not None:
        on_progress(len(space), len(space))
    return status, estimates


def _price_layouts(base: Scenario, space: list[Layout], estimator: Estimator,
                   on_progress: Callable[[int, int], None] | None, global_batch: int, hbm: float, status: list[str],
                   estimates: dict[str, list[Any]], codes: layout_table.Codes) -> None:
    """``_screen_columns``' loop: each layout's status and estimate appended to ``status`` and ``estimates``."""
    nan = float("nan")
    step_s, mfu, peak, bound, microbatches, capacity = estimates.values()
    sections: Sections = {}
    built: dict[int, tuple[Scenario, Degrees]] = {}
    degrees_of: dict[tuple[int, ...], Degrees] = {}  # per what a candidate's degrees read of its layout

    def build(index: int) -> tuple[Scenario, Degrees]:  # a layout's candidate and its degrees, built once
        found = built.get(index)
        if found is None:
            layout = space[index]
            scenario = _candidate_scenario(base, layout, global_batch, sections)
            # sim.spec.degrees reads these of a candidate (fsdp's ZeRO stage from zero and pp), the rest is the base's
            key = (layout.tp, layout.pp, layout.dp, layout.vpp, layout.zero, layout.ep, layout.etp, layout.cp,
                   layout.micro_batch)
            of = degrees_of.get(key)
            if of is None:
                of = degrees_of[key] = degrees(scenario)
            found = built[index] = (scenario, of)
        return found

    # The rules over the layout table: each runs once per distinct value of the knobs it reads (layout_table)
    lines = layout_table.reasons(codes, LAYOUT_KEYS, _DERIVED, build, len(space))
    invalid: dict[str, str] = {}  # one status string per line (the layouts a rule refuses alike share it)
    for index, layout in enumerate(space):
        if on_progress is not None and index and index % SCREEN_PROGRESS_EVERY == 0:
            on_progress(index, len(space))
        line = lines[index]
        if line is not None:
            text = invalid.get(line)
            if text is None:
                text = invalid[line] = f"invalid: {line}"
            status.append(text)
            for column in estimates.values():
                column.append(nan)
            continue
        scenario, implied = build(index)
        est = estimator.estimate(scenario, layout_keys(base, layout), implied)
        status.append("ok" if est.fits_in_memory else "oom")
        step_s.append(est.step_time_s)
        mfu.append(est.mfu)
        peak.append(est.peak_memory_bytes)
        bound.append(est.bound_s)
        # micro-batches per pipeline as degrees() counts them where only the global batch is given (candidate)
        microbatches.append(global_batch // (layout.dp * layout.micro_batch))
        capacity.append(hbm)


def _usable_cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _partition(space: list[Layout], parts: int) -> list[list[int]]:
    """``space``'s indices in ``parts`` shares of about equal work, each group (``_group``: a (pp, tp), and the
    zero-bubble layouts of one pp) in one share: most parts an estimator keeps follow the pipeline and the TP
    degree (a stage's structure, tails, activations and layer times; layouts of one (pp, tp) on one cluster share
    their dp) or, for zero-bubble schedules, the pipeline and the micro-batch count (the schedule's order), so a
    process seldom prices what another one does. A layout's work is taken as
    1 + pp/40 (the 175B and Mixtral screens, 2026-11-26: 60-104 us a layout at pp 2-8, 102-143 at pp 16, 167-183
    at pp 32). Where that leaves one share more than ``_MOST`` of the work, each (pp, tp, schedule) is a group
    instead. Two shares: the split of the groups with the least work in the larger share (every split tried, up
    to ``_SPLITS_TRIED``); else largest groups first, each to the share with the least work so far. ``space``'s
    order within a share. The 175B screen's two shares, each priced alone one after the other (2026-11-26, load
    5-8): 1.83-1.86 and 1.89-2.04 CPU s (3.60-4.11 in one process); by (pp, tp) alone 1.86-1.97 and 2.00-2.11;
    by pp alone 1.50 and 2.15-2.17."""
    for key in (_group, lambda layout: (layout.pp, layout.tp, layout.schedule)):
        groups: dict[Any, list[int]] = {}
        for index, layout in enumerate(space):
            groups.setdefault(key(layout), []).append(index)
        work = {name: len(indices) * (1 + space[indices[0]].pp / 40) for name, indices in groups.items()}
        shares = _split(groups, work, parts)
        total = sum(work.values())
        if max(sum(work[name] for name in share) for share in shares) <= _MOST * total:
            break
    return [sorted(i for name in share for i in groups[name]) for share in shares if share]


def _group(layout: Layout) -> tuple[int, int]:
    """``_partition``'s group of a layout: (pp, tp), or (pp, 0) for every zero-bubble layout of that depth,
    whatever its tp: their stage-level replays need the schedule's order per (schedule, pp, micro-batches), and
    building it (ZB-V's tries every fill variant) costs more than what one (pp, tp) shares across schedules."""
    return (layout.pp, 0) if layout.schedule.startswith(("zb", "dualpipe")) else (layout.pp, layout.tp)


def _split(groups: dict[Any, list[int]], work: dict[Any, float], parts: int) -> list[list[Any]]:
    """The groups' names in ``parts`` shares (``_partition``)."""
    names = sorted(groups, key=lambda name: -work[name])
    if parts == 2 and 2 ** len(names) <= _SPLITS_TRIED:
        total = sum(work.values())
        best, best_larger = names, total
        for mask in range(2 ** (len(names) - 1)):  # the first group always in the first share
            first = [name for bit, name in enumerate(names) if not mask >> bit & 1]
            larger = max(sum(work[name] for name in first), total - sum(work[name] for name in first))
            if larger < best_larger:
                best, best_larger = first, larger
        return [best, [name for name in names if name not in best]]
    shares: list[list[Any]] = [[] for _ in range(parts)]
    loads = [0.0] * parts
    for name in names:
        least = loads.index(min(loads))
        shares[least].append(name)
        loads[least] += work[name]
    return shares


_MOST = 0.6  # the largest share of the work _partition leaves to one process of two by (pp, tp) alone
_SPLITS_TRIED = 2 ** 16


def _screen_in_processes(base: Scenario, space: list[Layout], estimator: Estimator,
                         on_progress: Callable[[int, int], None] | None, jobs: int,
                         codes: layout_table.Codes) -> _Columns:
    """``_screen_columns`` in ``jobs`` forked processes, each over one share of ``space`` (``_partition``) with a
    copy of ``estimator`` (its topology and cost model built once, here); their rows put back in ``space``'s
    order. Each process reports its progress every ``SCREEN_PROGRESS_EVERY`` layouts."""
    context = multiprocessing.get_context("fork")
    shares = _partition(space, jobs)
    if len(shares) < 2:  # one group: nothing to share out
        return _screen_columns(base, space, estimator, on_progress, codes)
    sys.stdout.flush()  # a forked child must not write this process's buffered output a second time
    sys.stderr.flush()
    workers, pipes = [], []
    # The children's collector leaves what they inherit alone (Python's gc.freeze advice for fork): a collection
    # in a child would traverse this process's whole heap (after an earlier screen in this process, 0.7 CPU s more
    # for the 175B screen's two children, 2026-11-26) and copy the pages it touches.
    gc.freeze()
    try:
        for share in shares:
            receive, send = context.Pipe(duplex=False)
            rows = np.asarray(share)
            worker = context.Process(target=_screen_worker, daemon=True,
                                     args=(base, [space[i] for i in share], estimator, send,
                                           {name: column[rows] for name, column in codes.items()}))
            worker.start()
            send.close()
            workers.append(worker)
            pipes.append(receive)
    finally:
        gc.unfreeze()
    done = [0] * len(shares)
    results: dict[int, _Columns] = {}
    try:
        while len(results) < len(shares):
            for pipe in multiprocessing.connection.wait([p for i, p in enumerate(pipes) if i not in results]):
                part = next(i for i, p in enumerate(pipes) if p is pipe)
                try:
                    message: tuple[str, Any] = pipes[part].recv()
                except EOFError:
                    raise RuntimeError(f"a screening process ended without its rows (exit code "
                                       f"{workers[part].exitcode})") from None
                kind, payload = message
                if kind == "error":
                    raise RuntimeError(f"a screening process failed: {payload}")
                if kind == "done":
                    results[part] = payload
                    done[part] = len(shares[part])
                else:
                    done[part] = payload
                if on_progress is not None and kind == "progress":
                    on_progress(sum(done), len(space))
    finally:
        for worker in workers:
            if worker.is_alive() and len(results) < len(shares):
                worker.terminate()
            worker.join()
    # the shares' rows one after another, then each row of space taken from there (the same objects, in its order)
    back = np.argsort(np.concatenate([np.asarray(share) for share in shares]), kind="stable").tolist()

    def in_order(parts: list[list[Any]]) -> list[Any]:
        joined = list(itertools.chain.from_iterable(parts))
        return [joined[i] for i in back] if len(back) < 2 else list(operator.itemgetter(*back)(joined))

    status = in_order([results[part][0] for part in range(len(shares))])
    estimates = {name: in_order([results[part][1][name] for part in range(len(shares))]) for name in _ESTIMATE_COLUMNS}
    if on_progress is not None:
        on_progress(len(space), len(space))
    return status, estimates


def _screen_worker(base: Scenario, space: list[Layout], estimator: Estimator,
                   send: multiprocessing.connection.Connection, codes: layout_table.Codes) -> None:
    """A screening process: ``_screen_columns`` over its share, its progress and then its rows sent back."""
    try:
        columns = _screen_columns(base, space, estimator, lambda done, total: send.send(("progress", done)), codes)
        send.send(("done", columns))
    except BaseException as error:  # noqa: BLE001 - any failure goes back to the parent as one line
        send.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        send.close()


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

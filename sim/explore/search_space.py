"""The layout space ``sim search`` screens: the knobs, their values, and every combination of them.

In: a base ``Scenario`` (its model, cluster, global batch, sequence length and layer split) and optionally the values
``--only`` allows (``parse_only``). Out: ``Layout`` (one point: tp, pp, dp, vpp, micro-batch, schedule, ZeRO stage,
recompute, SP, ep, etp, cp, cp_comm_type) and its sweep overrides (``Layout.point``); ``LAYOUT_KEYS`` (a knob -> its
scenario field); ``layouts``, every combination, the rules checked later (sim.explore.search_candidate): tp over the
divisors of a node's GPUs that divide the heads and the FFN, pp over the splits the base's layers allow
(``pipeline_splits``), for a MoE model ep and etp (``expert_degrees``, Megatron-Core's parallel folding), cp where each
rank keeps ``CP_MIN_LOCAL_TOKENS`` tokens (``context_degrees``), every schedule but DualPipe's (``SEARCHED_SCHEDULES``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sim.errors import ConfigError
from sim.explore.sweep import parse_axis
from sim.parallel.schedules import SCHEDULES
from sim.spec.degrees import degrees, pipeline_slots
from sim.spec.scenario import FsdpSpec, Scenario

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
_SHARDING = {2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}  # the FSDP sharding of a ZeRO stage


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
        except ConfigError as error:  # parse_axis names --grid and the text: the same rule for --only
            raise ConfigError(str(error).replace(f"--grid {spec!r}", f"--only {spec!r}", 1)) from None
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
    stages, and vpp dividing the first, the last and a middle stage's count (sim.spec.rules_layout checks the same)."""
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

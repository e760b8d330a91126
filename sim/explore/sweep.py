"""Sweeps: a base scenario times a grid of dotted-path values, run point by point, resumable.

In: a base scenario file, base overrides, and a grid (ordered axes; each axis a list of values, where a value
is a scalar for the axis' dotted key, or a mapping of several dotted keys set together, e.g.
``{schedule: interleaved, parallel.vpp: 2}``); or a sweep YAML file holding the same (``base``, ``set``,
``grid``). Out: ``DIR/results.csv``, one row per point written and flushed as soon as it finishes (so an
interrupted sweep keeps what finished, and running the same command again runs only the missing points),
``DIR/sweep.json`` (the base scenario and overrides, so a directory of another sweep's rows is refused, not
resumed), and ``DIR/results.parquet`` with all rows in grid order at the end. Each row has the point's id and index, the
value of every swept key (as the scenario resolved it), a ``status`` (``ok``, ``oom``, ``invalid: <reason>``,
``error: <reason>``) and the summary metrics.

Setting ``training.microbatches`` without ``training.global_batch`` lets the global batch follow m.
Points run on an executor (sim.explore.executors): in-process, worker processes with ``jobs > 1``, or a Dask cluster;
the table is the same either way. A spec may also list its points explicitly (``sim search`` does).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import ConfigError, SimError
from sim.explore.confirm import confirm
from sim.explore.executors import DASK_TIMEOUT_S, Executor, run_all
from sim.output.atomic import write_atomically, write_text_atomically
from sim.spec.degrees import degrees
from sim.spec.scenario import (
    absolute_override,
    absolute_paths,
    apply_overrides,
    parse_yaml,
    read_text,
    scenario_from_dict,
)
from sim.workload.size import Limits

METRICS = (
    "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "bubble_fraction", "bubble_rate_stagewise",
    "host_bound_fraction", "exposed_tp_s", "exposed_pp_s", "exposed_dp_s", "exposed_ep_s", "peak_memory_bytes",
    "fits_in_memory", "microbatches", "global_batch", "num_gpus", "tasks",
)
RESULTS_CSV = "results.csv"


@dataclass
class SweepSpec:
    base: Path
    grid: dict[str, list[Any]]
    overrides: list[str] = field(default_factory=list)
    base_data: dict[str, Any] = field(default_factory=dict)  # the base scenario file, read once
    explicit: list[dict[str, Any]] | None = None  # the points themselves, instead of a grid's product

    def __post_init__(self) -> None:
        if not self.base_data:
            self.base_data = _read_base(self.base)

    def points(self) -> list[dict[str, Any]]:
        """Every combination of axis values, as {dotted key: value}, in grid order (last axis fastest)."""
        if self.explicit is not None:
            return [dict(point) for point in self.explicit]
        result = []
        for combo in itertools.product(*self.grid.values()):
            point: dict[str, Any] = {}
            for axis, value in zip(self.grid, combo, strict=True):
                point.update(value if isinstance(value, dict) else {axis: value})
            result.append(point)
        return result

    @property
    def keys(self) -> list[str]:
        keys: list[str] = []
        for point in self.explicit or []:
            keys += [key for key in point if key not in keys]
        for axis, values in self.grid.items():
            for value in values:
                for key in (value if isinstance(value, dict) else {axis: value}):
                    if key not in keys:
                        keys.append(key)
        return keys


def _read_base(path: Path) -> dict[str, Any]:
    data = parse_yaml(read_text(path, "sweep.base"), f"sweep.base {path}")
    if not isinstance(data, dict):
        raise ConfigError(f"sweep.base: {path} must be a scenario mapping (name, cluster, model, ...)")
    return data


def _encode(value: Any) -> str:
    """One-line text of a grid value that reads back as the same YAML value (JSON is YAML)."""
    return json.dumps(value, sort_keys=True)


def point_id(point: dict[str, Any]) -> str:
    return ",".join(f"{key}={_encode(value)}" for key, value in point.items())


# The most points one sweep runs: each is a simulation (0.1 s to minutes), so a grid beyond this is a typo or a
# runaway range, refused before its values are built (a range 1..10^8 was a list of 10^8 ints: a hang).
MAX_POINTS = 100_000


def parse_axis(text: str) -> tuple[str, list[Any]]:
    """``key=v1,v2,...`` (each value read as YAML), ``key=[v1, v2, ...]`` (a YAML list: the same axis) or
    ``key=a..b`` (integers a to b inclusive, a <= b, at most ``MAX_POINTS`` of them)."""
    if "=" not in text:
        raise ConfigError(f"--grid {text!r}: expected key=v1,v2,... or key=a..b")
    key, values = text.split("=", 1)
    if values.strip().startswith("["):  # --grid 'parallel.tp=[1,2]' (issue 27: was a YAML traceback)
        listed = parse_yaml(values, f"--grid {key.strip()}")
        if not isinstance(listed, list) or not listed:
            raise ConfigError(f"--grid {key.strip()}: expected a non-empty list of values, e.g. [1, 2]")
        return key.strip(), listed
    if ".." in values and "," not in values:
        low, high = values.split("..", 1)
        try:
            first, last = int(low), int(high)
        except ValueError:
            raise ConfigError(f"--grid {text!r}: a range a..b needs integers") from None
        if first > last:
            raise ConfigError(f"--grid {text!r}: a range a..b needs a <= b")
        if last - first + 1 > MAX_POINTS:
            raise ConfigError(f"--grid {text!r}: {last - first + 1:,} values, over the {MAX_POINTS:,} points a "
                              "sweep runs")
        return key.strip(), list(range(first, last + 1))
    return key.strip(), [parse_yaml(v, f"--grid {key.strip()}") for v in values.split(",")]


def load_sweep_file(path: Path, extra_grid: list[str], extra_overrides: list[str]) -> SweepSpec:
    data = parse_yaml(read_text(path, "sweep"), f"sweep {path}") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"sweep: {path} must be a mapping (base, grid, set)")
    unknown = set(data) - {"base", "set", "grid"}
    if unknown or "base" not in data or not isinstance(data.get("grid"), dict):
        raise ConfigError(f"sweep: {path} needs 'base' (a scenario path) and 'grid' (a mapping of axes)"
                          + (f"; unknown keys {sorted(unknown)}" if unknown else ""))
    grid: dict[str, list[Any]] = {}
    for key, values in data["grid"].items():
        if isinstance(values, str) and ".." in values:
            grid.update([parse_axis(f"{key}={values}")])
        else:
            grid[str(key)] = list(values) if isinstance(values, list) else [values]
    grid.update(dict(parse_axis(a) for a in extra_grid))
    return SweepSpec(path.parent / str(data["base"]), grid, list(data.get("set") or []) + extra_overrides)


def make_spec(target: Path, grid_args: list[str], overrides: list[str]) -> SweepSpec:
    """A sweep from a sweep file (has a top-level ``grid``) or from a scenario plus --grid axes; a grid of more
    than ``MAX_POINTS`` points is refused before anything runs."""
    data = parse_yaml(read_text(target, "sweep"), f"sweep {target}")
    if isinstance(data, dict) and "grid" in data:
        spec = load_sweep_file(target, grid_args, overrides)
    elif not grid_args:
        raise ConfigError("sweep: give at least one --grid key=v1,v2 (or a sweep file with a grid)")
    else:
        spec = SweepSpec(target, dict(parse_axis(a) for a in grid_args), overrides)
    sizes = [len(values) for values in spec.grid.values()]
    if math.prod(sizes) > MAX_POINTS:
        raise ConfigError(f"--grid: {math.prod(sizes):,} points ({' x '.join(f'{n:,}' for n in sizes)}), over the "
                          f"{MAX_POINTS:,} points a sweep runs; narrow an axis")
    return spec


def _lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def run_point(base_data: dict[str, Any], base_dir: str, overrides: list[str], point: dict[str, Any],
              keys: list[str], limits: Limits | None = None, files: dict[str, Any] | None = None) -> dict[str, Any]:
    """One point -> one row with the resolved value of every swept key. Never raises for a bad point: the
    reason goes into ``status`` (a point over ``limits``, the run budget, is ``error: <field>: ...``). ``files``:
    the point's file values made absolute (``shipped``), run in their place; the row shows the point as given."""
    row: dict[str, Any] = dict(point)
    try:
        raw = apply_overrides(copy.deepcopy(base_data), overrides)
        if "training.microbatches" in point and "training.global_batch" not in point:
            raw.setdefault("training", {})["global_batch"] = None
        raw = apply_overrides(raw, [f"{key}={_encode(value)}" for key, value in (point | (files or {})).items()])
        scenario = scenario_from_dict(raw, base_dir=base_dir)
        figures = confirm(scenario, limits)  # a full run's summary figures, without its trace (sim.explore.confirm)
    except ConfigError as error:
        return row | {"status": f"invalid: {error}"}
    except SimError as error:
        return row | {"status": f"error: {error}"}
    except Exception as error:  # noqa: BLE001 - a simulator bug in one point must not lose the sweep (issue 27)
        return row | {"status": f"error: internal {type(error).__name__}: {error}"}
    resolved = scenario.model_dump(mode="json") | {"training": {**scenario.model_dump(mode="json")["training"],
                                                               "microbatches": degrees(scenario).microbatches}}
    for key in keys:
        value = _lookup(resolved, key)
        row[key] = value if value is not None and not isinstance(value, dict) else point.get(key)
    exposed = figures.exposed_comm_s
    row |= {
        "status": "ok" if figures.fits_in_memory else "oom",
        **{k: getattr(figures, k) for k in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu",
                                            "bubble_fraction", "bubble_rate_stagewise", "host_bound_fraction",
                                            "fits_in_memory",
                                            "microbatches", "num_gpus", "tasks")},
        "exposed_tp_s": exposed["tp"], "exposed_pp_s": exposed["pp"], "exposed_dp_s": exposed["dp"],
        "exposed_ep_s": exposed.get("ep", 0.0),  # MoE token dispatch/combine; 0 for a dense model
        "peak_memory_bytes": figures.peak_memory_bytes, "global_batch": degrees(scenario).global_batch,
    }
    return row


def shipped(spec: SweepSpec, points: list[dict[str, Any]]) -> tuple[tuple[dict[str, Any], str],
                                                                    list[str], list[dict[str, Any]]]:
    """What is sent to the workers: (the base scenario, its absolute directory), the overrides, and each point's
    file values, with every file path a scenario can name (``model``'s config.json, ``costs.profile``) made
    absolute here, before shipping (sim.spec.overrides.absolute_paths: the scenario's directory, or the working
    directory for a ``--set`` config.json), so a Dask worker started in another directory reads the same files and
    the table equals the process executor's (issue 26). A path in the base scenario and in ``--set`` resolves as
    ``sim run`` resolves it."""
    base_dir = spec.base.parent.absolute()
    overrides = [absolute_override(item, base_dir) for item in spec.overrides]
    files = []
    for point in points:
        moved = {}
        for key, value in point.items():
            item = absolute_override(f"{key}={_encode(value)}", base_dir)
            if item != f"{key}={_encode(value)}":
                moved[key] = parse_yaml(item.split("=", 1)[1], key)
        files.append(moved)
    return (absolute_paths(spec.base_data, base_dir), str(base_dir)), overrides, files


def _read_done(path: Path, columns: list[str]) -> list[dict[str, str]]:
    """Rows already finished; a row cut off by a kill is dropped, and the file is rewritten clean (atomically) so
    appending continues on a fresh line. Each row is appended as one line ending in a newline and flushed, so the
    only row a kill can tear is the last, and a last line without its newline is that row, whatever it parses
    as (a number cut short would still look like a whole row); rows missing fields or a status are dropped too."""
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        text = handle.read()
    if not text.endswith("\n"):
        text = text[:text.rfind("\n") + 1]
    rows = [r for r in csv.DictReader(io.StringIO(text, newline="")) if r.get("status") and None not in r.values()]
    if rows and list(rows[0]) != columns:
        raise ConfigError(f"sweep: {path} has other columns than this sweep writes "
                          f"({_column_change(list(rows[0]), columns)}); use another output directory")
    def rewrite(temporary: Path) -> None:
        with temporary.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)

    write_atomically(path, rewrite)
    return rows


def _column_change(theirs: list[str], ours: list[str]) -> str:
    """How a results table's columns ``theirs`` differ from the ``ours`` this sweep writes, in words: the columns
    it lacks and has beyond ours, and whose they are: a metric's (``METRICS``) an older or newer clustersim's (e.g.
    a table from before summary.json version 2 lacks host_bound_fraction, and its bubble_fraction counted the
    compute stream's wait for the host, so its rows cannot join this table), a swept key's another grid's."""
    lacks = [name for name in ours if name not in theirs]
    extra = [name for name in theirs if name not in ours]
    words = ([f"lacks {', '.join(lacks)}"] if lacks else []) + ([f"has {', '.join(extra)}"] if extra else [])
    if not words:
        words = ["the same columns in another order"]
    metrics = set(lacks + extra) & set(METRICS)
    whose = ("written by an older or newer clustersim, whose summary figures differ" if metrics
             else "written by a different grid")
    return "; ".join(words) + f": {whose}"


MANIFEST = "sweep.json"


def _check_same_base(spec: SweepSpec, out: Path) -> None:
    """Resume only what the same base scenario and overrides produced: ``DIR/sweep.json`` records them, and a
    directory holding another scenario's results is refused rather than mixed into this one's table."""
    manifest = out / MANIFEST
    mine = json.loads(json.dumps({"base": spec.base_data, "overrides": spec.overrides}, default=str))
    if manifest.is_file():
        theirs = json.loads(manifest.read_text())
        if theirs != mine:
            name = theirs.get("base", {}).get("name", "?")
            raise ConfigError(f"sweep: {out} holds results of another base scenario or overrides (scenario "
                              f"{name!r}); use another output directory or delete it")
        return
    if (out / RESULTS_CSV).is_file():
        raise ConfigError(f"sweep: {out} holds results without a {MANIFEST} (written by an older clustersim, or "
                          "not a sweep); use another output directory or delete it")
    write_text_atomically(manifest, json.dumps(mine, indent=1, sort_keys=True) + "\n")


def run_sweep(spec: SweepSpec, out: Path, jobs: int = 1, on_start: Callable[[int, int], None] | None = None,
              on_row: Callable[[dict[str, Any]], None] | None = None, executor: Executor = "process",
              scheduler: str | None = None, only: set[int] | None = None,
              dask_timeout: float = DASK_TIMEOUT_S, limits: Limits | None = None,
              on_dashboard: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Run the missing points of ``spec`` (those listed in ``only``, if given) into ``out``; return every row
    written so far in grid order. ``on_start(total, already_done)`` and ``on_row(row)`` let the caller draw
    progress; ``dask_timeout`` is the seconds the Dask executor waits to connect to its scheduler. ``limits`` is
    each point's run budget; its default memory share is split between the ``jobs`` points that run at once on
    this machine (not with a remote ``scheduler``, whose workers have their own memory). ``on_dashboard``: with the
    Dask executor, serve its dashboard and call this with the link (sim.explore.executors.run_all)."""
    limits = limits or Limits()
    if limits.max_memory is None and jobs > 1 and scheduler is None:
        limits = Limits(limits.max_tasks, limits.memory // jobs)
    out.mkdir(parents=True, exist_ok=True)
    _check_same_base(spec, out)
    points = spec.points()
    columns = ["point", "point_id", *spec.keys, "status", *METRICS]
    csv_path = out / RESULTS_CSV
    done = {row["point_id"] for row in _read_done(csv_path, columns)}
    todo = [(i, p) for i, p in enumerate(points) if point_id(p) not in done and (only is None or i in only)]
    new_file = not csv_path.is_file()
    with csv_path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        if new_file:
            writer.writeheader()
            handle.flush()
        if on_start:
            on_start(len(points), len(points) - len(todo))

        def record(index: int, point: dict[str, Any], row: dict[str, Any]) -> None:
            writer.writerow({"point": index, "point_id": point_id(point), **row})
            handle.flush()
            if on_row:
                on_row(row)

        base, overrides, files = shipped(spec, [point for _, point in todo])
        jobs_list = [((index, point), (*base, overrides, point, spec.keys, limits, point_files))
                     for (index, point), point_files in zip(todo, files, strict=True)]
        # closing: an interrupt in record() stops the executor's workers at once, not when the generator is freed
        with contextlib.closing(run_all(run_point, jobs_list, jobs, executor, scheduler, dask_timeout,
                                          on_dashboard)) as rows:
            for (index, point), row in rows:
                record(index, point, row)
    table = pd.read_csv(csv_path).sort_values("point", kind="stable").reset_index(drop=True)
    write_atomically(out / "results.parquet", lambda path: table.to_parquet(path, index=False))
    return table

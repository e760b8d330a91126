"""``sim check`` and ``sim schema``: a scenario looked at without simulating it.

In: the parsed arguments (``check``: the scenario and ``--set``; ``schema``: ``scenario`` or ``summary``). Out:
``check`` prints the scenario with every default filled, the per-stage memory bound, the parameter counts and the
notes, exit code 0 (a bad scenario is one ``error:`` line from ``sim.cli.commands.main``); ``schema`` writes the
JSON Schema of scenario files or of summary.json to stdout, plain.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    from sim import api
    from sim.cli.tables import memory_table, parameters_line
    from sim.spec.degrees import degrees

    checked = api.check(args.scenario, args.set)
    scenario = checked.scenario
    console.print(checked.resolved_yaml, markup=False, highlight=False)
    console.print(memory_table(scenario, checked.memory_plan))
    implied = degrees(scenario)
    console.print(parameters_line(scenario.model))
    if scenario.training.method != "full":
        share = checked.trainable_params / checked.model_params
        console.print(f"{scenario.training.method}: trainable parameters {checked.trainable_params:,.0f} of "
                      f"{checked.model_params:,.0f} ({share:.2%})")
    for note in checked.notes:
        console.print(note, markup=False, highlight=False)
    console.print(f"ok: {scenario.name}: {implied.num_gpus} GPUs, {implied.microbatches} micro-batches per step")
    return 0


def cmd_schema(args: argparse.Namespace, console: Console) -> int:
    """``sim schema [scenario|summary]``: the JSON Schema on stdout, plain (no console wrapping)."""
    if args.what == "summary":
        from sim.output.summary import json_schema
        document = json_schema()
    else:
        from sim.spec.json_schema import scenario_schema
        document = scenario_schema()
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return 0

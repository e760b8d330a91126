"""The task-graph IR is the seam (sim.workload.ir): readers import it and not the builder, stream and kind
names are StrEnums whose values are the trace's strings, and a built graph is frozen and never written by a
run."""

import json
import os
import subprocess
import sys

import pytest

from sim import runner
from sim.network.models import AnalyticNetwork, ContentionNetwork, IdealNetwork, is_flow_level
from sim.output import trace
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload import build as workload
from sim.workload.ir import COMM_KINDS, COMPUTE_KINDS, STREAMS, Kind, Stream, TaskGraph

from conftest import ROOT, SCENARIOS

HEAVY = ("sim.workload.build", "sim.costs.models", "sim.spec", "pydantic")


@pytest.mark.parametrize("module", ["sim.engine.event", "sim.engine.longest_path", "sim.engine.critical_path",
                                    "sim.engine.sm_contention"])
def test_an_engine_loads_neither_the_builder_nor_pydantic(module):
    """In a fresh interpreter: importing an engine loads the IR and the network protocol, not the builder, the
    cost models, the scenario schema or pydantic (nor networkx, which only the topology needs)."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    loaded = json.loads(done.stdout)
    assert "sim.workload.ir" in loaded
    assert [name for name in loaded if name.startswith(HEAVY + ("networkx",))] == []


def test_stream_and_kind_names_are_the_strings_the_trace_holds():
    assert [str(s) for s in STREAMS] == ["compute", "tp", "pp", "dp", "dp_replica", "offload", "host", "ep",
                                          "expert_dp", "cp"]
    assert COMPUTE_KINDS == ("forward", "backward", "weight", "recompute") and COMM_KINDS == ("tp", "pp", "dp")
    assert Stream.DP_REPLICA == "dp_replica" and hash(Kind.OPTIMIZER) == hash("optimizer")
    frame = runner.run(load_scenario(SCENARIOS / "tiny.yaml")).trace
    for column, names in (("stream", Stream), ("kind", Kind)):
        assert {type(value) for value in frame[column]} == {str}  # exact str, not the enum
        assert set(frame[column]) <= set(names)
    assert set(frame["stream"]) == {"compute", "tp", "pp", "dp"}  # dp: the gradient norm's all-reduce
    assert set(frame["kind"]) == {"forward", "backward", "optimizer", "tp", "pp"}


def _graph(stream_dp, kind_dp, compute):
    graph = TaskGraph(match_collectives=False)
    a = graph.add(0, 0, compute, Kind.FORWARD, "mlp", 0, 0, [], duration=1.5, flops=3.0)
    graph.add(0, 0, stream_dp, kind_dp, "grad_bucket", -1, 0, [a], op="all_reduce", nbytes=4096.0, group=(0, 1))
    graph.freeze()
    return graph


def test_a_trace_of_enum_members_is_byte_identical_to_one_of_strings(tmp_path):
    """The builder may pass ``Stream``/``Kind`` members or their strings: the written trace is the same."""
    start, end = [0.0, 1.5], [1.5, 2.0]
    written = {}
    for label, graph in (("enum", _graph(Stream.DP, Kind.DP, Stream.COMPUTE)), ("str", _graph("dp", "dp", "compute"))):
        frame = trace.to_frame(graph, start, end)
        assert {type(v) for v in frame["stream"]} == {type(v) for v in frame["kind"]} == {str}
        for suffix in (".csv", ".parquet"):
            path = tmp_path / f"{label}{suffix}"
            trace.write_trace(frame, path)
            written[label, suffix] = path.read_bytes()
    assert written["enum", ".csv"] == written["str", ".csv"]
    assert written["enum", ".parquet"] == written["str", ".parquet"]
    # the last field is the op, empty for a compute task
    assert written["str", ".csv"].decode().splitlines()[1] == "0,0,0,compute,forward,mlp,0,0,0,1.5,0,3,"


def test_a_built_graph_is_frozen():
    graph = workload.build(resolve(load_scenario(SCENARIOS / "tiny.yaml")))
    assert graph.frozen and all(type(task.deps) is tuple for task in graph.tasks)
    assert sum(len(task.deps) for task in graph.tasks) > 0
    with pytest.raises(RuntimeError, match="task graph is frozen: cannot add forward task 'x' on rank 0"):
        graph.add(0, 0, "compute", "forward", "x", 0, 0, [])


@pytest.mark.parametrize("stream, kind, message", [
    ("nvlink", "forward",
     "unknown stream\\(s\\) nvlink; streams are compute, tp, pp, dp, dp_replica, offload, host, ep, expert_dp"),
    ("compute", "fwd", "unknown kind\\(s\\) fwd; kinds are forward, backward, weight, recompute, optimizer, tp"),
])
def test_freezing_rejects_names_outside_the_enums(stream, kind, message):
    graph = TaskGraph()
    graph.add(0, 0, stream, kind, "x", 0, 0, [], duration=1.0)
    with pytest.raises(ValueError, match=message):
        graph.freeze()


def test_a_contended_run_leaves_the_built_graph_as_built():
    """SM contention (network.nccl_sms) replays with stretched compute durations, but the run's graph keeps the
    durations it was built with: the same tasks as a fresh build, while the trace's compute ran longer."""
    scenario = load_scenario(SCENARIOS / "tiny.yaml", ["network.nccl_sms=24", "parallel.tp=1", "parallel.dp=2"])
    built = workload.build(resolve(scenario))
    before = [task.duration for task in built.tasks]
    result = runner.run(scenario)
    assert [task.duration for task in result.graph.tasks] == before
    assert result.graph.tasks == built.tasks
    spans = (result.trace["end_s"] - result.trace["start_s"]).to_numpy()
    stretched = [i for i, duration in enumerate(before)
                 if result.graph.tasks[i].stream == "compute" and spans[i] > duration * (1 + 1e-9)]
    assert stretched and (result.summary.nccl_sm_stretch_s or 0.0) > 0
    plain = runner.run(load_scenario(SCENARIOS / "tiny.yaml", ["parallel.tp=1", "parallel.dp=2"]))
    assert result.summary.step_time_s > plain.summary.step_time_s


def test_the_contention_model_is_the_flow_level_network():
    result = runner.build_topology(resolve(load_scenario(SCENARIOS / "tiny.yaml")))
    contention = ContentionNetwork(result)
    assert is_flow_level(contention) and not is_flow_level(AnalyticNetwork(result))
    assert not is_flow_level(IdealNetwork())
    assert len(contention.capacities) == len(result.links)
    (phase,) = contention.transfer("send", 1e6, (0, 2))  # across the two nodes: one InfiniBand hop chain
    assert phase.latency > 0 and phase.channels[0].nbytes == 1e6

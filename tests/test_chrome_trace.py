"""The Chrome/Perfetto trace against the Trace Event Format's rules (Chrome's "Trace Event Format" document;
Perfetto's JSON importer): integer pid/tid on every event, a process_name/thread_name metadata event for each
(pid, tid) an event uses, flow events (s/f) that pair up by id and bind inside a slice of the right thread, and the
same scenario + seed giving the same bytes."""

from __future__ import annotations

import json

import pytest

from sim import runner
from sim.output.trace import EXPOSED_THREAD, EXPOSED_TID, STREAM_TIDS, chrome_trace
from sim.spec.scenario import load_scenario

from conftest import SCENARIOS

CASES = {
    "pipeline": ("pipeline-4x8.yaml", []),
    "dp-all-ranks": ("tiny.yaml", ["ranks=all"]),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def chrome(request):
    name, overrides = CASES[request.param]
    result = runner.run(load_scenario(SCENARIOS / name, overrides))
    return result, chrome_trace(result.trace, result.link_segments, result.graph)


def test_every_event_has_integer_pid_and_tid_and_required_fields(chrome):
    _, doc = chrome
    for event in doc["traceEvents"]:
        assert {"ph", "pid", "tid", "name"} <= set(event), event
        assert type(event["pid"]) is int and type(event["tid"]) is int, event
        if event["ph"] in ("X", "s", "f", "C"):
            assert isinstance(event["ts"], float) and event["ts"] >= 0.0
        if event["ph"] == "X":
            assert event["dur"] >= 0.0


def test_metadata_names_every_process_and_thread_used(chrome):
    result, doc = chrome
    events = doc["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in events if e["ph"] in ("X", "s", "f")}
    assert used <= set(threads)
    assert {pid for pid, _ in used} <= set(processes)
    assert processes[0] == "rank 0"
    # each thread is named after its stream, and the tid is that stream's index
    for (_pid, tid), name in threads.items():
        assert {**STREAM_TIDS, EXPOSED_THREAD: EXPOSED_TID}[name] == tid
    sorted_threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_sort_index"}
    assert sorted_threads == set(threads)
    assert len([e for e in events if e["ph"] == "X" and e["cat"] != "exposed"]) == len(result.trace)


def test_flows_pair_up_and_bind_inside_their_slices(chrome):
    result, doc = chrome
    events = doc["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    assert len(starts) == len([e for e in events if e["ph"] == "s"])  # ids unique
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for flow_id, s in starts.items():
        f = ends[flow_id]
        assert f["bp"] == "e" and s["cat"] == f["cat"]
        for event in (s, f):
            assert any(a <= event["ts"] <= b for a, b in slices[(event["pid"], event["tid"])]), event
        if s["cat"] == "pp":
            assert s["pid"] != f["pid"] and s["ts"] <= f["ts"]
    cats = {e["cat"] for e in starts.values()}
    trace = result.trace
    if (trace["kind"] == "pp").any():
        assert "pp" in cats
        # one arrow per cross-rank edge of the graph
        tasks = result.graph.tasks
        cross = sum(1 for t in tasks for d in t.deps if tasks[d].rank != t.rank)
        assert sum(1 for e in starts.values() if e["cat"] == "pp") == cross > 0
    else:
        assert "collective" in cats
        members = {}
        for task in result.graph.tasks:
            if task.collective >= 0:
                members[task.collective] = members.get(task.collective, 0) + 1
        assert sum(1 for e in starts.values() if e["cat"] == "collective") == sum(n - 1 for n in members.values())


def test_same_scenario_and_seed_give_identical_chrome_bytes():
    texts = []
    for _ in range(2):
        result = runner.run(load_scenario(SCENARIOS / "pipeline-4x8.yaml"))
        texts.append(json.dumps(chrome_trace(result.trace, None, result.graph), default=int))
    assert texts[0] == texts[1]


def test_exposed_slices_sum_to_the_summarys_exposed_communication(chrome):
    """The exposed-communication thread: per kind, the worst rank's slices add up to summary.exposed_comm_s, and
    each slice lies inside a transfer of its kind on its rank and outside every compute task of that rank."""
    result, doc = chrome
    exposed = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "exposed"]
    assert bool(exposed) == any(v > 0 for v in result.summary.exposed_comm_s.values())
    assert all(e["tid"] == EXPOSED_TID for e in exposed)
    per_rank: dict[tuple[str, int], float] = {}
    for e in exposed:
        key = (e["args"]["kind"], e["pid"])
        per_rank[key] = per_rank.get(key, 0.0) + e["dur"] / 1e6
    for kind, seconds in result.summary.exposed_comm_s.items():
        worst = max((v for (k, _), v in per_rank.items() if k == kind), default=0.0)
        assert worst == pytest.approx(seconds, rel=1e-9, abs=1e-12), kind
    trace = result.trace
    for e in exposed[:200]:
        a, b = e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6
        rows = trace[trace["rank"] == e["pid"]]
        compute = rows[rows["stream"] == "compute"]
        assert not ((compute["start_s"] < b - 1e-12) & (compute["end_s"] > a + 1e-12)).any()
        comm = rows[rows["kind"] == e["args"]["kind"]]
        assert ((comm["start_s"] <= a + 1e-12) & (comm["end_s"] >= a)).any()

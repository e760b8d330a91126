"""The engine on hand-built task graphs: serial sums, overlap, rendezvous, deadlock."""

import pytest

from sim.engine.event import simulate
from sim.errors import ScheduleDeadlock
from sim.network.models import IdealNetwork
from sim.workload.ir import TaskGraph


class ConstantNetwork:
    """Every collective takes its bytes in seconds (1 B/s), so times are easy to read."""

    name = "constant"
    flow_level = False  # the engine asks for its times, it moves no flows

    def collective_time(self, op, nbytes, group):
        return nbytes

    def p2p_time(self, nbytes, src, dst):
        return nbytes


def compute(g, rank, duration, deps=(), stream="compute"):
    return g.add(rank=rank, stage=0, stream=stream, kind="forward", name="x", microbatch=0, layer=0,
                 deps=list(deps), duration=duration)


def comm(g, rank, nbytes, deps=(), collective=-1, stream="tp"):
    return g.add(rank=rank, stage=0, stream=stream, kind="tp", name="all_reduce", microbatch=0, layer=0,
                 deps=list(deps), op="all_reduce", nbytes=nbytes, group=(0, 1), collective=collective)


def test_serial_tasks_on_one_stream_sum():
    g = TaskGraph()
    for d in (1.0, 2.0, 3.5):
        compute(g, 0, d)
    r = simulate(g, IdealNetwork())
    assert r.end[-1] == 6.5 and r.start == [0.0, 1.0, 3.0]


def test_independent_compute_and_comm_overlap_to_the_max():
    g = TaskGraph()
    compute(g, 0, 3.0)
    comm(g, 0, 5.0)
    r = simulate(g, ConstantNetwork())
    assert max(r.end) == 5.0


def test_dependency_across_streams_serializes():
    g = TaskGraph()
    a = compute(g, 0, 3.0)
    comm(g, 0, 5.0, deps=[a])
    r = simulate(g, ConstantNetwork())
    assert r.start[1] == 3.0 and r.end[1] == 8.0


def test_rendezvous_starts_at_the_last_arrival():
    g = TaskGraph()
    compute(g, 0, 1.0)
    compute(g, 1, 4.0)
    comm(g, 0, 2.0, deps=[0], collective=7)
    comm(g, 1, 2.0, deps=[1], collective=7)
    r = simulate(g, ConstantNetwork())
    assert r.start[2] == r.start[3] == 4.0
    assert r.end[2] == r.end[3] == 6.0


def test_missing_dependency_raises_a_deadlock_naming_the_task():
    g = TaskGraph()
    a = compute(g, 0, 1.0)
    b = compute(g, 1, 1.0)
    g.tasks[a].deps.append(b)
    g.tasks[b].deps.append(a)
    with pytest.raises(ScheduleDeadlock, match=r"task 0 \(rank 0 compute forward x mb 0 layer 0\) waits on task 1"):
        simulate(g, IdealNetwork())


def test_a_collective_missing_a_member_deadlocks():
    g = TaskGraph()
    comm(g, 0, 1.0, collective=3)
    comm(g, 1, 1.0, collective=3)
    g.tasks[1].deps.append(1)  # waits on itself: the rendezvous never completes
    with pytest.raises(ScheduleDeadlock, match="2 stream"):
        simulate(g, ConstantNetwork())


def test_the_rendezvous_rule_releases_at_the_last_arrival():
    from sim.engine.rendezvous import Rendezvous

    meets = Rendezvous({7: 3})
    assert meets.arrive(7, 10, 2.0) is None and meets.arrive(7, 11, 5.0) is None
    assert meets.arrive(7, 12, 3.5) == (5.0, [10, 11, 12])  # the latest member releases all three
    assert meets.arrival == {10: 2.0, 11: 5.0, 12: 3.5}

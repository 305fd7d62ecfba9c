"""The Ray engine's live view of replicas and stream replicas (replistream.engines.ray.topology): built from
the physical plan, changed by failures, garbage collection, revivals and removals; no Ray needed."""
from __future__ import annotations

from replistream.gc import OperatorReplica, StreamReplica, snapshot_from_plan
from replistream.engines.ray.topology import Topology
from replistream.plan import PhysicalPlan
from replistream.workloads import fig1_query

PLACEMENT = {"entry": ["a", "b"], "loads": ["a", "b"], "pings": ["b", "c"], "correlate": ["c", "a"],
             "hot": ["a", "c"], "alerts": ["a"]}


def topology():
    q = fig1_query(2)
    placement = {n: PLACEMENT.get(n, ["b", "c"]) for n in ["entry", *q.operators]}
    placement.update({n: ["a"] for n in q.sinks})
    plan = PhysicalPlan(q, placement)
    topo = Topology(plan)
    for r in plan.replicas():
        topo.attach(r.label, f"handle:{r.label}")
    return q, placement, plan, topo


def test_starts_as_the_plan_and_its_snapshot_is_the_plans():
    q, placement, plan, topo = topology()
    assert [r.label for r in topo.replicas()] == [r.label for r in plan.replicas()]
    assert [s.id for s in topo.streams()] == [e.id for e in plan.streams()]
    assert all(topo.channel(e.id) == e.channel for e in plan.streams())
    assert topo.snapshot(kmin=1) == snapshot_from_plan(q, placement)
    assert topo.alive() == {r.label: True for r in plan.replicas()}
    assert topo.servers()["entry#1"] == "b" and topo.handle("entry#1") == "handle:entry#1"


def test_a_failure_stops_the_replica_and_its_stream_replicas():
    _, _, _, topo = topology()
    assert topo.mark_failed("correlate#0") and not topo.mark_failed("correlate#0")
    assert topo.replica("correlate#0").state == "failed" and not topo.is_running("correlate#0")
    assert not any(s.live for s in topo.streams(touching="correlate#0"))
    assert ("correlate#0", "handle:correlate#0") not in topo.running()
    assert topo.snapshot().replica("correlate#0").state == "failed"


def test_retiring_stops_an_operator_replica_but_not_an_entry_replica():
    _, _, _, topo = topology()
    assert topo.retire("correlate#1") and not topo.is_running("correlate#1")
    assert not topo.retire("entry#1") and topo.is_running("entry#1")  # still fed
    assert topo.replica("entry#1").state == "dormant"
    assert topo.mark_failed("entry#1") and topo.replica("entry#1").state == "dormant"


def test_a_new_replica_and_reconnected_stream_replicas():
    _, _, _, topo = topology()
    assert topo.next_label("correlate") == "correlate#2"
    topo.add_replica(OperatorReplica("correlate#2", "correlate", "b", stateful=True))
    assert not topo.is_running("correlate#2") and "correlate#2" not in topo.alive()
    s = StreamReplica("loads#0", "correlate#2", 0, 0.0, 0.0, 0.0, False, "loads")
    topo.put_stream(s)
    assert topo.channel(s.id) is None
    topo.connect(s.id, 3)
    assert topo.stream(s.id).live and topo.channel(s.id) == 3
    topo.disconnect(s.id)
    assert not topo.stream(s.id).live and topo.channel(s.id) == 3  # the channel stays
    topo.attach("correlate#2", "h2")
    assert topo.running("correlate")[-1] == ("correlate#2", "h2")


def test_removed_replicas_leave_the_view_and_their_stream_replicas_go():
    _, _, _, topo = topology()
    stop = topo.remove(["hot#0", "hot#1"])
    assert [label for label, _ in stop] == ["hot#0", "hot#1"]
    assert topo.removed() == {"hot#0", "hot#1"} and "hot#0" not in topo
    assert not topo.replicas("hot") and not topo.streams(touching="hot#0")
    assert topo.alive()["hot#0"] is False and "hot#0" in topo.handles()
    snap = topo.snapshot()
    assert not snap.replicas_of("hot") and not snap.in_streams("alerts")

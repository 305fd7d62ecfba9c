"""replistream.gc.partitions: garbage collection and revival per partition replica (issue #41 point 5).
The view makes each partition an operator and each (port, upstream partition) an input; decisions
translate back to the deployment's labels, ports and operators."""
from __future__ import annotations

import itertools

import pytest

from replistream.gc import (OperatorReplica, Snapshot, StreamReplica, collect_garbage, dependents, partition_view,
                            plan_revival)
from replistream.plan import label_group, replica_partition


def snapshot(k=(2, 2), theta=0.0, kmin=1) -> Snapshot:
    """entry#0 -> w (partitions with k[P] replicas) -> f#0, f#1 (one port) -> app; latencies vary."""
    reps = [OperatorReplica("entry#0", "entry", "s0", "entry")]
    reps += [OperatorReplica(f"w.{p}#{r}", "w", f"s{p}{r}", stateful=True) for p, n in enumerate(k) for r in range(n)]
    reps += [OperatorReplica("f#0", "f", "a"), OperatorReplica("f#1", "f", "b"),
             OperatorReplica("app", "app", "c", "application")]
    ws = [r.label for r in reps if r.operator == "w"]
    lat = itertools.count(5, 7)
    streams = [StreamReplica("entry#0", w, latency_ms=next(lat), stream="s") for w in ws]
    streams += [StreamReplica(w, f, latency_ms=next(lat), stream="w") for w in ws for f in ("f#0", "f#1")]
    streams += [StreamReplica(f, "app", latency_ms=next(lat), stream="f") for f in ("f#0", "f#1")]
    return Snapshot(reps, streams, kmin, theta)


def live_per_partition(snap: Snapshot) -> dict:
    out: dict[str, int] = {}
    for r in snap.replicas:
        if replica_partition(r.label) is not None:
            out[label_group(r.label)] = out.get(label_group(r.label), 0) + r.live
    return out


def test_per_operator_kmin_would_take_a_partition_to_zero_the_view_never_does():
    raw = collect_garbage(snapshot(k=(1, 3)))
    assert min(live_per_partition(raw.snapshot).values()) == 0  # what the view prevents: a partition lost
    for k, kmin in (((1, 3), 1), ((2, 2), 1), ((3, 2), 2), ((2, 3), 2)):
        v = partition_view(snapshot(k=k, kmin=kmin))
        result = collect_garbage(v.snapshot)
        assert result.steps > 0
        left = live_per_partition(result.snapshot)
        assert left == {"w.0": min(kmin, k[0]), "w.1": min(kmin, k[1])}, (k, kmin, left)
        # every decision names the deployment's own stream replicas (real ports) and replicas
        raw_ids = {s.id for s in snapshot(k=k, kmin=kmin).streams}
        for d in result.decisions:
            assert set(v.discard(d).streams) <= raw_ids, d.streams


def test_a_replica_needs_a_live_feeder_from_every_upstream_partition():
    v = partition_view(snapshot(k=(1, 2)))
    assert v.snapshot.ports("f#0") == (0, 1)  # port 0 from w.0, input 1 = port 0 from w.1
    assert v.snapshot.upstream_operator("f", 1) == "w.1"
    g = dependents(v.snapshot, "w.0#0->f#0:0")  # f#0's only feeder from partition 0: f#0 goes with it
    assert g is not None and g.replicas == ("f#0",), g
    raw = snapshot(k=(1, 2))
    assert dependents(raw, "w.0#0->f#0:0").replicas == ()  # per port, f#0 looked fed (by w.1): wrong


def test_revival_creates_a_replica_of_the_hindered_partition_with_real_ports():
    v = partition_view(snapshot(k=(2, 1)))
    snap = v.snapshot.evolve(streams_live={"w.1#0->f#1:1": False})  # f#1 starved of partition 1 ...
    snap = collect_garbage(snap.evolve(theta=snap.total_cost())).snapshot
    events = plan_revival(snap, {"w.1#0": 30.0}, threshold_s=1.0, place=lambda op, s, h: "z")
    made = [e for e in events if e.new_replicas]
    assert made, [e.describe() for e in events]
    e = v.event(made[0])
    assert [r.label for r in e.new_replicas] == ["w.1#1"] and e.new_replicas[0].operator == "w"
    assert {s.port for s in e.new_streams} == {0}, [s.id for s in e.new_streams]  # f has one real port
    assert {s.dst for s in e.new_streams if s.src == "w.1#1"} <= {"f#0", "f#1"}


def test_without_partitions_the_view_is_the_snapshot():
    s = Snapshot([OperatorReplica("entry#0", "entry", "a", "entry"), OperatorReplica("app", "app", "b", "application")],
                 [StreamReplica("entry#0", "app")])
    v = partition_view(s)
    assert v.snapshot is s and not v.partitioned and v.stream_id("entry#0->app:0") == "entry#0->app:0"


@pytest.mark.parametrize("seed", range(6))
def test_random_thetas_never_take_a_partition_below_kmin(seed):
    import random

    rnd = random.Random(seed)
    k = (rnd.randint(1, 3), rnd.randint(1, 3), rnd.randint(1, 3))
    kmin = rnd.randint(1, 2)
    base = snapshot(k=k[:2], kmin=kmin)
    v = partition_view(base.evolve(theta=base.total_cost() * rnd.random()))
    left = live_per_partition(collect_garbage(v.snapshot).snapshot)
    assert all(left[f"w.{p}"] >= min(kmin, k[p]) for p in (0, 1)), (k, kmin, left)

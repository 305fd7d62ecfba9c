"""Live rescaling on Ray (issue #41): ``dep.rescale(op, p)`` moves bins of a partitioned operator's
key space to new partitions while the query is fed (Megaphone §3.3; replistream/replica/rescale.py,
replistream/engines/ray/rescale.py). The output equals the reference run exactly, 1 -> 2 -> 4
all at once, and fluidly with a replica of the giving partition killed in the middle."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from replistream import Query, deploy, seconds
from replistream.sources import Call
from replistream.testing import assert_same_output, run_reference

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]

SERVERS = ["boston", "london", "tokyo"]


def query():
    q = Query("rescaled")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(0.1))
    s.window(size=seconds(1), by="k", aggs={"n": "count", "t": ("v", "sum")}, name="per_k").sink("out")
    return q.build()


def inputs(n=40_000, chunk=500, seed=3, span=120):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(span), n))
    k, v = rng.integers(0, 500, n), rng.normal(size=n)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, n, chunk)]}


class Gate:
    """A point in the input where the feeder waits (a ``Call`` sentinel) until the test opens it:
    the test acts while the sources are open at a known point of the stream, whatever the
    machine's speed."""

    def __init__(self):
        self.reached, self.opened = threading.Event(), threading.Event()

    def sentinel(self):
        def wait(_dep):
            self.reached.set()
            assert self.opened.wait(300), "the gate was never opened"
        return Call(wait)


def gated(data, gates):
    """``data`` with ``gates`` at equal distances along the source's chunks."""
    chunks = list(data["s"])
    step = len(chunks) // (len(gates) + 1)
    for i, g in reversed(list(enumerate(gates, start=1))):
        chunks.insert(i * step, g.sentinel())
    return {"s": chunks}


def rescale_at(dep, gate, p, strategy, then=None) -> dict:
    """Rescale ``per_k`` to ``p`` while the feeder waits at ``gate``; the gate opens once the switch
    is made (the partitions counted; the feed is held until the steps are handed out), so the
    steps' times pass as the feed goes on; ``then()`` runs right after. Returns the record."""
    rec: dict = {}
    t = threading.Thread(target=lambda: rec.update(dep.rescale("per_k", p, strategy=strategy)))
    t.start()
    tick = threading.Event()
    while dep.partitions("per_k") != p and t.is_alive():
        tick.wait(0.01)
    gate.opened.set()
    if then is not None:
        then()
    t.join(timeout=300)
    assert not t.is_alive(), "the rescale did not return"
    return rec


def test_rescale_one_to_two_to_four_partitions_all_at_once_is_exact():
    q, data = query(), inputs()
    ref = run_reference(q, data)
    first_gate, second_gate = Gate(), Gate()
    with deploy(q, servers=SERVERS, k=2, parallelism={"per_k": 1}, bits=8) as dep:
        assert dep.partitions("per_k") == 1 and "per_k.0#1" in dep.handles
        dep.feed(gated(data, [first_gate, second_gate]), pace=None)
        assert first_gate.reached.wait(120)
        first = rescale_at(dep, first_gate, 2, "all-at-once")
        assert second_gate.reached.wait(120)
        second = rescale_at(dep, second_gate, 4, "all-at-once")
        assert (first["steps"], first["bins_moved"]) == (1, 128)  # 1 -> 2: half the 2^8 bins, one step
        assert (second["steps"], second["bins_moved"]) == (4, 128)  # 2 -> 4: a quarter each way
        assert dep.partitions("per_k") == 4
        assert sorted(first["new_replicas"]) == ["per_k.1#0", "per_k.1#1"]
        with pytest.raises(ValueError, match="fewer partitions"):
            dep.rescale("per_k", 2)
        dep.wait(timeout=300)
        res = dep.collect()
    assert res.complete
    assert_same_output(ref.outputs["out"], res.outputs["out"])


def test_a_fluid_rescale_survives_a_giving_replica_killed_during_the_move():
    q, data = query(), inputs(seed=5)
    ref = run_reference(q, data)
    gate = Gate()
    with deploy(q, servers=SERVERS, k=2, parallelism={"per_k": 1}, bits=7) as dep:
        dep.feed(gated(data, [gate]), pace=8.0)
        assert gate.reached.wait(120)
        rec = rescale_at(dep, gate, 2, "fluid", then=lambda: dep.kill_replica("per_k.0", 1))
        # (a replica of the giving partition killed once the switch is made: its peer gives every step)
        assert rec.get("steps") == 64, rec  # 1 -> 2 at 2^7 bins: 64 bins, one per step
        dep.wait(timeout=300)
        res = dep.collect()
    assert res.complete
    assert_same_output(ref.outputs["out"], res.outputs["out"])

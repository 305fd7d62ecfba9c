"""Live rescaling on Ray (issue #41): ``dep.rescale(op, p)`` moves bins of a partitioned operator's
key space to new partitions while the query is fed (Megaphone §3.3; replistream/replica/rescale.py,
replistream/engines/ray/rescale.py). The output equals the reference run exactly, 1 -> 2 -> 4
all at once, and fluidly with a replica of the giving partition killed in the middle."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from replistream import Query, deploy, seconds
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


def _fed(dep, chunks):
    """Wait until the feeder sent ``chunks`` chunks (the rescale happens while it feeds)."""
    done = threading.Event()
    while not (dep.fed and dep.fed[-1][2] >= chunks):
        done.wait(0.02)


def test_rescale_one_to_two_to_four_partitions_all_at_once_is_exact():
    q, data = query(), inputs()
    ref = run_reference(q, data)
    with deploy(q, servers=SERVERS, k=2, parallelism={"per_k": 1}, bits=8) as dep:
        assert dep.partitions("per_k") == 1 and "per_k.0#1" in dep.handles
        dep.feed(data, pace=8.0)
        _fed(dep, 10)
        first = dep.rescale("per_k", 2, strategy="all-at-once")
        second = dep.rescale("per_k", 4, strategy="all-at-once")
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
    with deploy(q, servers=SERVERS, k=2, parallelism={"per_k": 1}, bits=7) as dep:
        dep.feed(data, pace=8.0)
        _fed(dep, 10)
        rec: dict = {}
        t = threading.Thread(target=lambda: rec.update(dep.rescale("per_k", 2, strategy="fluid")))
        t.start()
        tick = threading.Event()
        while "per_k.1#1" not in dep.handles and t.is_alive():  # the new partition is starting
            tick.wait(0.01)
        dep.kill_replica("per_k.0", 1)  # a replica of the giving partition: its peer gives every step
        t.join(timeout=300)
        assert rec.get("steps") == 64, rec  # 1 -> 2 at 2^7 bins: 64 bins, one per step
        dep.wait(timeout=300)
        res = dep.collect()
    assert res.complete
    assert_same_output(ref.outputs["out"], res.outputs["out"])

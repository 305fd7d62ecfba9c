"""Partitioned operators on Ray (issue #41): ``deploy(parallelism={op: p})`` runs ``op`` as ``p``
key partitions of ``k`` replicas each (``op.P#R``); every upstream replica sends a tuple to the
replicas of its bin's partition only. A crashed partition replica is repaired from a peer of its
own partition (never another partition's, which holds other keys), a later crash of that peer is
then masked too, and the output equals the reference run exactly. (The fault model across the
engines: tests/engines/test_conformance.py, the partitioned cases.)"""
from __future__ import annotations

import time

import numpy as np
import pytest
import ray

from replistream import Query, QueryError, deploy, seconds
from replistream.sources import Call, KillReplica, inject_at
from replistream.testing import assert_same_output, run_reference

pytestmark = [pytest.mark.usefixtures("ray_session")]

SERVERS = ["boston", "london", "tokyo"]


def query():
    q = Query("partitioned")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    (s.map(lambda b: {"k": b["k"], "v": b["v"] * 2}, {"k": "i8", "v": "f8"}, name="m")
      .window(size=seconds(3), by="k", aggs={"n": "count", "hi": ("v", "max")}, name="per_k").sink("out"))
    return q.build()


def inputs(n=6_000, chunk=100, seed=3):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(60), n))
    k, v = rng.integers(0, 40, n), rng.normal(size=n)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, n, chunk)]}


def crash(label):
    """The actor dies behind the deployment's back (only the liveness check tells)."""
    return Call(lambda d: ray.kill(d.topology.handle(label), no_restart=True))


def repaired(label, deadline_s=120):
    """Wait (in the feeder) until ``label``'s repair is done."""
    def wait(d):
        end = time.time() + deadline_s
        while not any(r["replica"] == label and r.get("repaired") for r in d.repairs):
            assert time.time() < end, f"{label} was not repaired: {d.repairs}"
            d.check_failures()
            time.sleep(0.05)
    return Call(wait)


@pytest.mark.slow
def test_a_partition_replica_is_repaired_from_its_own_partition_and_its_peer_may_crash_later():
    q, data = query(), inputs()
    ref = run_reference(q, data)
    s = inject_at(data["s"], seconds(12), crash("per_k.1#0"))
    s = inject_at(s, seconds(13), repaired("per_k.1#0"))
    s = inject_at(s, seconds(30), KillReplica("per_k.1", 1))  # k=2 without the repair: partition 1 lost
    s = inject_at(s, seconds(40), KillReplica("m.0", 1))
    with deploy(q, servers=SERVERS, k=2, repair=True, parallelism={"per_k": 2, "m": 2}) as dep:
        assert sorted(dep.handles) == ["entry#0", "entry#1", "m.0#0", "m.0#1", "m.1#0", "m.1#1", "out",
                                       "per_k.0#0", "per_k.0#1", "per_k.1#0", "per_k.1#1"]
        with pytest.raises(RuntimeError, match="feed"):
            dep.remove_operator("per_k")  # (changes run on partitions: test_changes_partitions_ray.py) not unfed
        res = dep.run({"s": s}, pace=None, timeout=300)
        done = [r for r in dep.repairs if r.get("repaired")]
        assert done and done[0]["replica"] == "per_k.1#0" and done[0]["new"] == "per_k.1#2", dep.repairs
        live = sorted(r.label for r in dep.topology.replicas("per_k.1", state="live"))
        assert "per_k.1#2" in live and all(lab.startswith("per_k.1#") for lab in live), live
        assert dep.fault_tolerance()["fault_tolerance_per_node"]["per_k"] >= 0
        # each partition of m took its share of the stream, and the shares make the whole (no tuple
        # twice, none lost): m.0#0 and m.1#0 ran from start to end
        passed = [ray.get(dep.topology.handle(f"m.{p}#0").stats.remote(), timeout=60)["core"]["filters"][0]["passed"]
                  for p in (0, 1)]
        assert min(passed) > 0 and sum(passed) == sum(len(c["ts"]) for c in data["s"]), passed
    assert res.complete
    assert_same_output(ref.outputs["out"], res.outputs["out"])


def test_a_partitioned_deployment_refuses_what_it_does_not_run_yet_in_one_line():
    q = query()
    with pytest.raises(ValueError, match=r"parallelism\['per_k'\] must be an integer >= 1"):
        deploy(q, servers=SERVERS, k=2, parallelism={"per_k": 0})
    g = Query("global")
    g.source("s", {"k": "i8"}).window(seconds(1), name="total").sink("out")
    with pytest.raises(QueryError, match="no by= key"):
        deploy(g.build(), servers=SERVERS, k=2, parallelism={"total": 2})

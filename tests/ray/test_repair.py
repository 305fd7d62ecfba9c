"""Automatic repair (deploy(repair=True)): a crashed operator replica is replaced on its server
by hand-over from a live peer, so the operator is back to k replicas and a later crash of its
other replica is masked too; every run equals the reference."""
from __future__ import annotations

import time

import numpy as np
import pytest
import ray

from replistream import Query, RunFailed, deploy, seconds
from replistream.sources import Call, KillReplica, KillServer, inject_at
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")

SERVERS = ["boston", "london", "tokyo"]


def query():
    q = Query("repair")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(3), by="k", aggs={"n": "count", "hi": ("v", "max")}, name="per_k").sink("out")
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
    """Wait (in the feeder) until ``label``'s repair is done, as a user would wait for redundancy."""
    def wait(d):
        end = time.time() + deadline_s
        while not any(r["replica"] == label and r.get("repaired") for r in d.repairs):
            assert time.time() < end, f"{label} was not repaired: {d.repairs}"
            d.check_failures()  # the liveness check runs in the waits
            time.sleep(0.05)
    return Call(wait)


@pytest.mark.slow
@pytest.mark.parametrize("spares", [0, 1])
def test_a_crashed_replica_is_repaired_and_the_other_may_crash_later(spares):
    q = query()
    data = inputs()
    ref = run_reference(q, data)
    s = data["s"]
    s = inject_at(s, seconds(15), crash("per_k#0"))
    s = inject_at(s, seconds(16), repaired("per_k#0"))
    s = inject_at(s, seconds(30), KillReplica("per_k", 1))  # with k=2 and no repair: every replica lost
    with deploy(q, servers=SERVERS, k=2, repair=True, spares=spares) as dep:
        res = dep.run({"s": s}, pace=None, timeout=300)
        done = [r for r in dep.repairs if r.get("repaired")]
        assert [r["replica"] for r in done][:1] == ["per_k#0"]
        new = done[0]["new"]
        stats = ray.get(dep.topology.handle(new).stats.remote())
        assert stats["first_output_wall"] is not None and stats["first_output_wall"] >= done[0]["detected_wall"]
        live = [r.label for r in dep.topology.replicas("per_k") if r.state == "live"]
        assert new in live
    assert res.complete
    assert_same_output(ref.outputs["out"], res.outputs["out"])


@pytest.mark.slow
def test_without_repair_the_same_crashes_lose_every_replica():
    q = query()
    data = inputs()
    s = inject_at(data["s"], seconds(15), KillReplica("per_k", 0))
    s = inject_at(s, seconds(30), KillReplica("per_k", 1))
    with deploy(q, servers=SERVERS, k=2) as dep:
        with pytest.raises(RunFailed, match="every replica of 'per_k' is lost"):
            dep.run({"s": s}, timeout=300)
        assert dep.repairs == []


@pytest.mark.slow
def test_replicas_of_a_lost_server_are_not_rebuilt_and_an_entry_replica_is():
    q = query()
    data = inputs()
    ref = run_reference(q, data)
    placement = {"entry": ["london", "tokyo"], "per_k": ["boston", "london"], "out": ["tokyo"]}
    s = inject_at(data["s"], seconds(15), KillServer("boston"))
    s = inject_at(s, seconds(20), KillReplica("entry", 0))
    with deploy(q, servers=SERVERS, k=2, placement=placement, repair=True) as dep:
        res = dep.run({"s": s}, timeout=300)
        why = {r["replica"]: r["why"] for r in dep.repairs if not r.get("repaired")}
        done = {r["replica"]: r["new"] for r in dep.repairs if r.get("repaired")}
    assert "server boston is lost" in why["per_k#0"]
    assert done.get("entry#0") == "entry#2"
    assert_same_output(ref.outputs["out"], res.outputs["out"])


def test_an_entry_replica_repaired_from_its_peer_then_the_peer_crashes():
    """Issue #29: a crashed entry replica is rebuilt from a live peer's input state (entry logic,
    next chunk, retained output); once it runs, its peer may crash too: the repaired one alone
    carries the input until it is repaired in turn (from the first repaired one), and the output
    equals the reference."""
    q = query()
    data = inputs()
    ref = run_reference(q, data)
    s = inject_at(data["s"], seconds(15), crash("entry#0"))
    s = inject_at(s, seconds(16), repaired("entry#0"))
    s = inject_at(s, seconds(30), KillReplica("entry", 1))  # without the repair: every entry replica lost
    with deploy(q, servers=SERVERS, k=2, repair=True) as dep:
        res = dep.run({"s": s}, pace=None, timeout=300)
        ev = [e for e in dep.events if e.get("event") == "entry_repaired"]
        live = [r.label for r in dep.topology.replicas("entry") if r.state == "live"]
    # the repaired replica carried the input alone, then handed it over to the second repair
    assert [(e["actor"], e["new"], e["from"]) for e in ev] == [("entry#0", "entry#2", "entry#1"),
                                                             ("entry#1", "entry#3", "entry#2")]
    assert live == ["entry#2", "entry#3"]
    assert res.complete
    assert_same_output(ref.outputs["out"], res.outputs["out"])


def test_repair_must_be_a_bool():
    with pytest.raises(ValueError, match="repair must be True or False"):
        deploy(query(), servers=SERVERS, k=2, repair="yes")

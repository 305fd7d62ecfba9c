"""Actor processes reused across deployments (replistream/engines/ray/pool.py): a later deployment
re-initialises the actors an earlier one left, nothing of the earlier run leaks into it, and
actors that may still be reached from the old run are never kept."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import ray

import replistream as rs
from replistream.engines.ray import deploy, pool
from replistream.sources import Call, KillReplica
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture(autouse=True)
def fresh_pool():
    pool.clear_pool()
    pool.set_pool_size(16)
    yield
    pool.set_pool_size(None)


def keyed(seed, n=6_000, name="pooled"):
    rng = np.random.default_rng(seed)
    q = rs.Query(name)
    s = q.source("s", {"key": "i8", "x": "f8"}, punctuate_every=100_000)
    s.filter(lambda b: b["x"] > 0.2, name="f").window(size=200_000, by="key", aggs={"n": "count"},
                                                       name="w").sink("out")
    q.build()
    ts = np.sort(rng.integers(0, 3_000_000, n))
    data = {"s": [{"ts": ts[a:a + 500], "key": rng.integers(0, 9, len(ts[a:a + 500])),
                   "x": rng.random(len(ts[a:a + 500]))} for a in range(0, n, 500)]}
    return q, data


def pids(dep):
    return {label: ray.get(h.pid.remote()) for label, h in dep.handles.items()}


@pytest.mark.slow
def test_a_second_deployment_reuses_the_processes_and_is_exact():
    q1, d1 = keyed(1)
    with deploy(q1, servers=3, k=2) as dep:
        res1 = dep.run(d1)
        first = pids(dep)
    assert_same_output(run_reference(q1, d1).outputs["out"], res1.outputs["out"])
    kept = pool.pooled()
    # every replica and the coordinator; its warm standby too once it had started (on a loaded machine
    # it may still be starting at the shutdown, and is then not kept)
    assert sum(v for c, v in kept.items() if c != "CoordinatorActor") == len(first)
    assert kept.get("CoordinatorActor") in (1, 2)
    q2, d2 = keyed(2, name="again")  # another query and input: nothing of run 1 may show
    with deploy(q2, servers=3, k=2) as dep:
        res2 = dep.run(d2)
        second = pids(dep)
        assert dep.metrics()["applications"]["out"]["delivered"] == len(res2.outputs["out"])
    assert set(second.values()) == set(first.values())
    assert_same_output(run_reference(q2, d2).outputs["out"], res2.outputs["out"])


@pytest.mark.slow
def test_killed_replicas_are_not_kept_and_the_rest_are_reused():
    q, d = keyed(3)
    d["s"].insert(4, KillReplica("w", 0))
    with deploy(q, servers=3, k=2) as dep:
        res = dep.run(d)
        dead = {label for label, up in dep.alive.items() if not up}
    assert dead == {"w#0"}
    assert_same_output(run_reference(q, d).outputs["out"], res.outputs["out"])
    kept = pool.pooled()  # entry, f, w (one killed), out, the coordinator (and its standby once started)
    assert sum(v for c, v in kept.items() if c != "CoordinatorActor") == 2 * 3 + 1 - 1
    assert kept.get("CoordinatorActor") in (1, 2)
    q2, d2 = keyed(4)
    with deploy(q2, servers=3, k=2) as dep:
        res2 = dep.run(d2)
    assert_same_output(run_reference(q2, d2).outputs["out"], res2.outputs["out"])


@pytest.mark.slow
def test_nothing_is_kept_when_the_run_was_cut_short():
    q, d = keyed(5)
    release = threading.Event()
    # the feeder is still at work when the deployment ends (a sentinel that does not look at the
    # shutdown; a Pause ends early when it sees it, and then nothing is in flight)
    d["s"].insert(2, Call(lambda dep: release.wait(60)))
    dep = deploy(q, servers=3, k=2)
    dep.feed(d)
    try:
        dep.shutdown()
        assert pool.pooled() == {}
    finally:
        release.set()


def _dead_within(h, seconds: float) -> bool:
    """True once calls to ``h`` fail as to a dead actor (each answered call shows it still lives)."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(h.__ray_ready__.remote(), timeout=seconds)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.05)  # it answered: the kill has not reached it yet
    return False


@pytest.mark.slow
def test_a_kept_actor_that_died_is_replaced():
    q, d = keyed(6)
    with deploy(q, servers=3, k=1) as dep:
        dep.run(d)
    killed = [h for handles in pool._pool.values() for h in handles]
    for h in killed:  # every kept actor dies while kept
        ray.kill(h, no_restart=True)
    for h in killed:  # ray.kill is asynchronous: a call can still reach the actor (and the next
        assert _dead_within(h, 60)  # deployment take it) before it dies; wait until each is gone
    q2, d2 = keyed(7)
    with deploy(q2, servers=3, k=1) as dep:
        res = dep.run(d2)
    assert_same_output(run_reference(q2, d2).outputs["out"], res.outputs["out"])


def test_reuse_can_be_turned_off():
    pool.set_pool_size(0)
    q, d = keyed(8)
    with deploy(q, servers=3, k=1) as dep:
        dep.run(d)
    assert pool.pooled() == {}
    with pytest.raises(ValueError, match="pool size"):
        pool.set_pool_size(-1)


@pytest.mark.slow
def test_a_warm_spare_takes_a_revived_replica_and_the_run_stays_exact():
    q, d = keyed(9, n=8_000)
    ref = run_reference(q, d)
    with deploy(q, servers=3, k=2, spares=1) as dep:
        assert pool.pooled() == {"ReplicaActor": 1}  # the spare, idle
        spare_pid = ray.get(pool._pool["ReplicaActor"][0].pid.remote())
        dep.feed(d)
        dep.kill_replica("w", 0)
        ev = dep.revive_replica("w", 0)
        assert ev["new_replicas"] and pool.pooled() == {}
        new = ev["new_replicas"][0]["label"]
        assert ray.get(dep.handles[new].pid.remote()) == spare_pid
        # the spare was never fed: taking it kept its frozen set-up (no full collection of every
        # object in the process while the live replica serves; gcpause.thaw)
        thaws = ray.get(dep.handles[new].stats.remote(), timeout=30)["gc"]["thaws"]
        assert thaws["kept"] >= 1, thaws
        assert dep.wait(120)
        res = dep.collect()
    assert_same_output(ref.outputs["out"], res.outputs["out"])
    with pytest.raises(ValueError, match="spares"):
        deploy(q, servers=3, k=2, spares=-1)


@pytest.mark.slow
def test_a_stopped_replica_is_killed_at_shutdown_and_the_others_are_kept():
    """A replica stopped by a fault (SIGSTOP) and not resumed cannot answer the pool's quiescing,
    and its peers' calls to it never complete while it lives: it is killed first, so its peers
    settle and are kept (before, the pool waited its deadline on them and kept none)."""
    from replistream.sources import StopReplica, inject_at

    q, d = keyed(5)
    d["s"] = inject_at(d["s"], 1_000_000, StopReplica("w", 0))
    with deploy(q, servers=3, k=2) as dep:
        res = dep.run(d)
        assert any(e.get("event") == "stopped" and e.get("actor") == "w#0" for e in dep.events)
        stopped_pid = dep._pids["w#0"][0]
        others = {label for label in dep.handles if label != "w#0"}
    assert_same_output(run_reference(q, d).outputs["out"], res.outputs["out"])
    kept = pool.pooled()
    assert sum(v for c, v in kept.items() if c != "CoordinatorActor") == len(others), kept
    kept_pids = {ray.get(h.pid.remote(), timeout=30) for c, hs in pool._pool.items() if c != "CoordinatorActor"
                 for h in hs}
    assert stopped_pid not in kept_pids

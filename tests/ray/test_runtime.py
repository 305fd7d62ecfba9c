"""End-to-end replication transparency on Ray (Hwang §III): the applications of a
replicated deployment receive exactly the reference output, as a multiset of
(id, ts, values), through replica kills, entry-point crashes, delayed and cut links."""
from __future__ import annotations

import random

import numpy as np
import pytest

import replistream as rs
from replistream.engines.ray import deploy
from replistream.testing import Call, KillReplica, KillServer, assert_same_output, run_reference
from replistream.workloads import fig1_inputs, fig1_query

pytestmark = pytest.mark.usefixtures("ray_session")


def small_fig1(n_servers=3, duration_s=60, period_s=1.0, seed=0, chunk=5):
    q = fig1_query(n_servers=n_servers, window_s=3.0, punctuate_s=1.0)
    data = fig1_inputs(n_servers=n_servers, duration_s=duration_s, period_s=period_s, seed=seed, chunk=chunk)
    return q, data


def with_kills(data: dict, kills: list, seed: int) -> dict:
    """Insert kill sentinels at random points of random sources' inputs."""
    rng = random.Random(seed)
    data = {s: list(v) for s, v in data.items()}
    for ev in kills:
        src = rng.choice(sorted(data))
        data[src].insert(rng.randrange(1, len(data[src])), ev)
    return data


def check(dep, q, data, timeout=120):
    ref = run_reference(q, data)
    res = dep.run(data, timeout=timeout)
    assert res.complete, f"applications did not receive the end of stream: {res.punctuation}"
    for app in q.sinks:
        assert_same_output(ref.outputs[app], res.outputs[app])
    return ref, res


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 3])
def test_fig1_no_failures(k):
    q, data = small_fig1(seed=k)
    with deploy(q, servers=4, k=k) as dep:
        ref, res = check(dep, q, data)
        assert len(res.outputs["alerts"]) > 0
        m = dep.metrics()
        assert m["applications"]["alerts"]["delivered"] == len(ref.outputs["alerts"])
        assert all(a.get("cpu_seconds", 0) >= 0 for a in m["actors"].values())


@pytest.mark.slow
@pytest.mark.parametrize("k,seed", [(2, 1), (3, 2), (3, 3)])
def test_random_replica_kills(k, seed):
    """Kill up to k-1 replicas of every operator and of the entry points at random points."""
    q, data = small_fig1(seed=seed)
    rng = random.Random(seed)
    kills = []
    for op in ["entry"] + q.operators:
        for r in rng.sample(range(k), rng.randint(1, k - 1)):
            kills.append(KillReplica(op, r))
    with deploy(q, servers=4, k=k) as dep:
        check(dep, q, with_kills(data, kills, seed))
        dead = [e for e in dep.events if e.get("event") == "dead"]
        assert len(dead) == len(kills)


@pytest.mark.slow  # a full Ray run: 9.0 s of the quick subset (#31)
def test_kill_a_server():
    q, data = small_fig1(seed=5)
    with deploy(q, servers=3, k=2) as dep:
        app_server = dep.plan["alerts"][0]
        victim = next(s for s in dep.plan["correlate"] if s != app_server)  # not the application's own server
        check(dep, q, with_kills(data, [KillServer(victim)], 5))
        assert not any(dep.alive[l] for l, s in dep.actor_server.items() if s == victim)


@pytest.mark.slow
def test_delayed_and_cut_links_on_geo_network():
    q, data = small_fig1(seed=7, duration_s=20)
    with deploy(q, servers=["boston", "london", "tokyo", "sydney"], k=2, network="geo-static", seed=7) as dep:
        a, b = dep.plan["loads"][0], dep.plan["correlate"][0]
        c, d = dep.plan["correlate"][1], dep.plan["hot"][1]
        events = [Call(lambda dp: dp.delay_link(a, b, 300.0, duration=2.0)),
                  Call(lambda dp: dp.cut_link(c, d, duration=1.0))]
        ref, res = check(dep, q, with_kills(data, events, 7))
        kinds = [e["event"] for e in dep.events]
        assert "delay_link" in kinds and "cut_link" in kinds


@pytest.mark.slow
def test_paced_run_reports_latency():
    q, data = small_fig1(seed=9, duration_s=3, period_s=0.25, chunk=1)
    with deploy(q, servers=3, k=2, network="geo-static") as dep:
        ref = run_reference(q, data)
        res = dep.run(data, pace=1.0, timeout=60)
        assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
        lat = res.metrics["applications"]["alerts"]["latency_ms"]
        assert lat["count"] == len(ref.outputs["alerts"])
        # emulated WAN: end-to-end latency must be at least one wide-area hop, and finite
        assert 0 < lat["p50"] < 10_000


@pytest.mark.slow
def test_malformed_records_are_dead_lettered_and_the_rest_flows():
    q = rs.Query("bad")
    s = q.source("s", {"x": "i8"}, punctuate_every=10)
    s.filter(lambda b: b["x"] >= 0).sink("out")
    q.build()
    good = [{"ts": t, "x": t} for t in range(50)]
    bad = [{"ts": 50, "x": "oops"}, {"ts": 51.5, "x": 1}, {"ts": 52}]
    data = {"s": [good[:25], bad, good[25:]]}
    with deploy(q, servers=2, k=2) as dep:
        res = dep.run(data, timeout=60)
        assert res.complete
        assert sorted(res.outputs["out"]["x"].tolist()) == list(range(50))
        reasons = [d.reason for d in res.dead_letters]
        assert len(reasons) == 3 and all("malformed" in r for r in reasons)
        assert any("'x'" in r for r in reasons) and any("'ts'" in r for r in reasons)


def test_invalid_deployments_fail_before_any_actor_starts():
    import ray

    q, _ = small_fig1()
    before = len(ray.util.list_named_actors(all_namespaces=True)) if hasattr(ray.util, "list_named_actors") else 0
    with pytest.raises(ValueError, match="k=5 replicas need at least 5 distinct servers"):
        deploy(q, servers=3, k=5)
    with pytest.raises(ValueError, match="unknown server 'atlantis'"):
        deploy(q, servers=["boston", "atlantis"], k=1)
    with pytest.raises(ValueError, match="unknown server"):
        deploy(q, servers=3, k=1, placement={"hot": ["nowhere"]})
    with pytest.raises(ValueError, match="two replicas of 'hot' on one server"):
        deploy(q, servers=3, k=2, placement={"hot": ["boston", "boston"]})
    with pytest.raises(ValueError, match="k \\(the degree of replication\\) must be an integer >= 1"):
        deploy(q, servers=3, k=0)
    bad = rs.Query("dangling")
    bad.source("s", {"x": "i8"}).filter(lambda b: b["x"] > 0)
    with pytest.raises(rs.QueryError, match="no application"):
        deploy(bad, servers=2, k=1)


@pytest.mark.slow
def test_applications_deliver_to_callbacks_and_parquet(tmp_path):
    import pyarrow.parquet as pq

    q, data = small_fig1(seed=11, duration_s=20)
    seen = []
    with deploy(q, servers=3, k=2, parquet_dir=str(tmp_path), on_output={"alerts": seen.append}) as dep:
        ref, res = check(dep, q, data)
        files = ray_get_parquet_files(dep)
    got = np.concatenate(seen)
    assert_same_output(ref.outputs["alerts"], got)
    assert files and all(f.startswith(str(tmp_path / "alerts")) for f in files)
    table = pq.read_table(str(tmp_path / "alerts"))
    assert table.num_rows == len(ref.outputs["alerts"])
    assert sorted(table.column("id").to_pylist()) == sorted(ref.outputs["alerts"]["id"].tolist())
    with pytest.raises(ValueError, match="not an application"):
        deploy(q, servers=3, k=1, on_output={"nope": print})


def ray_get_parquet_files(dep):
    import ray

    return ray.get(dep.sinks["alerts"].stats.remote())["parquet_files"]

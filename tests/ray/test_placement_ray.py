"""Placement on Ray: deploy(..., placement="min-cost"), the coordinator, and a 3-node cluster."""
import pytest

from replistream.network import Server, default_servers
from replistream.placement import PlacementError, PlacementPolicy, fig1_sources, load_servers
from replistream.engines.ray import deploy
from replistream.engines.ray.resolve import resolve_placement, resolve_servers
from replistream.testing import as_multiset, run_reference
from replistream.workloads import fig1_inputs, fig1_query

def test_requests_that_cannot_be_placed_fail_before_any_actor_starts():
    q = fig1_query(2)
    close = [Server("boston", 42.36, -71.06), Server("providence", 41.82, -71.41), Server("newyork", 40.71, -74.01)]
    # no ray_session fixture: these must fail in validation, without Ray
    with pytest.raises(PlacementError, match=r"replica 2 of 'entry'.*d_min"):
        deploy(q, servers=close, k=2, placement="min-cost")
    with pytest.raises(ValueError, match="one replica per node"):
        deploy(q, servers=4, k=2, placement="non-replicated")
    with pytest.raises(ValueError, match="neither a Ray node id"):
        deploy(q, servers=[Server("a", 1.0, 2.0, node="rack7"), Server("b", 50.0, 8.0)], k=1)


def test_strategies_by_name_through_resolve_placement():
    q = fig1_query(3)
    servers = default_servers(6)
    for name in ("min-cost", "random"):
        plan = resolve_placement(q, servers, 2, name)
        assert all(len(plan[n]) == 2 and len(set(plan[n])) == 2 for n in ["entry"] + q.operators)
        assert len(plan["alerts"]) == 1
    assert resolve_placement(q, servers, 2, "min-cost") == PlacementPolicy("min-cost")(q, servers, 2)


def test_a_plan_that_cannot_be_costed_does_not_stop_a_deployment():
    from replistream.network import NetworkConditions, TraceLatencyModel
    from replistream.engines.ray.resolve import evaluate_plan

    q = fig1_query(1)
    servers = default_servers(3)
    trace = TraceLatencyModel({("boston", "london"): [(0.0, 40.0)]}, servers=[s.name for s in servers])
    plan = resolve_placement(q, servers, 2, "spread")
    assert evaluate_plan(q, servers, plan, NetworkConditions(trace)) is None  # no samples for tokyo
    assert evaluate_plan(q, servers, plan, None).network_cost > 0


def test_servers_from_a_file(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[[server]]\nname = "a"\ncoords = [0.0, 0.0]\n[[server]]\nname = "b"\ncoords = [0.0, 80.0]\n'
                    '[[server]]\nname = "c"\ncoords = [60.0, 0.0]\n')
    assert [s.name for s in resolve_servers(str(path))] == ["a", "b", "c"]
    assert resolve_servers(load_servers(path)) == list(load_servers(path).servers)
    with pytest.raises(ValueError, match="server file"):
        resolve_servers("boston")


@pytest.mark.slow
def test_min_cost_deployment_on_logical_servers(ray_session, tmp_path):
    q = fig1_query(3, window_s=3.0)
    servers = default_servers(6)
    policy = PlacementPolicy("min-cost", sources=fig1_sources, d_min=30.0)
    offline = policy.placement(q, servers, 2)  # the static geographic model, as network="geo-static" (seed 0)
    data = fig1_inputs(3, duration_s=30, period_s=1.0, seed=2, chunk=10)
    dep = deploy(q, servers=servers, k=2, placement=policy, network="geo-static")
    try:
        assert dep.plan == offline.plan()
        assert dep.placement.network_cost == pytest.approx(offline.network_cost)
        for label, server in dep.actor_server.items():
            node = label.rsplit("#", 1)[0]
            idx = int(label.rsplit("#", 1)[1]) if "#" in label else 0
            assert dep.plan[node][idx] == server
        res = dep.run(data, timeout=180)
        assert as_multiset(res.outputs["alerts"]) == as_multiset(run_reference(q, data).outputs["alerts"])
        c = dep.coordinator
        assert ray_session.get(c.plan.remote()) == dep.plan
        assert ray_session.get(c.network_cost.remote()) == pytest.approx(offline.network_cost)
        assert "Algorithm 5" in ray_session.get(c.explain.remote())
        stats = ray_session.get(c.collect_stats.remote(30.0))
        assert stats.rates["load_0"] == pytest.approx(30 / 30.0 * q.schema_of("load_0").dtype.itemsize)
        assert stats.rates["correlate"] > 0
        new = ray_session.get(c.place.remote())
        assert new["current_network_cost"] > 0 and new["network_cost"] <= new["current_network_cost"] * 1.0001
        assert set(new["plan"]) == set(dep.plan)
    finally:
        dep.shutdown()


@pytest.mark.slow
def test_default_min_cost_by_name_and_spread_is_costed_too(ray_session, tmp_path):
    """placement="min-cost" with servers from a file of network coordinates and no emulated delay."""
    path = tmp_path / "s.csv"
    path.write_text("name,x,y\na,0,0\nb,0,80\nc,60,0\nd,5,5\n")
    q = fig1_query(2)
    ss = load_servers(path)
    expected = PlacementPolicy("min-cost").placement(q, list(ss.servers), 2, ss.latency())
    dep = deploy(q, servers=str(path), k=2, placement="min-cost")
    try:
        assert dep.plan == expected.plan()
        assert ray_session.get(dep.coordinator.network_cost.remote()) == pytest.approx(expected.network_cost)
        assert "d" not in dep.plan["entry"] or "a" not in dep.plan["entry"]  # a and d are 7 ms apart < d_min
    finally:
        dep.shutdown()
    dep = deploy(q, servers=3, k=2)  # "spread": not placed by a policy, but costed by the coordinator
    try:
        assert dep.placement is not None and dep.placement.strategy == "given"
        assert ray_session.get(dep.coordinator.network_cost.remote()) == pytest.approx(dep.placement.network_cost)
    finally:
        dep.shutdown()


@pytest.mark.slow
def test_min_cost_on_a_three_node_cluster(multinode_results):
    """Servers pinned by node id, node label and custom resource; every replica lands on its node
    (tests/ray/scripts/multinode_checks.py, run once for this and tests/ray/test_multinode.py)."""
    results, code, stderr = multinode_results
    assert "placement" in results, f"no result; stderr:\n{stderr[-3000:]}"
    result = results["placement"]
    assert result["misplaced_actors"] == {}, "every actor must run on its server's Ray node"
    assert result["actors"] == 16  # 5 nodes x k=3 + the application
    assert result["plan_is_offline_placement"] and result["one_replica_per_node"]
    assert result["coordinator_network_cost"] == pytest.approx(result["offline_network_cost"])
    assert result["matches_reference"] and result["complete"]
    assert result["cluster_servers"]["by_id_ok"], result["cluster_servers"]["by_id"]
    assert result["cluster_servers"]["by_label_ok"], result["cluster_servers"]["by_label"]
    assert code == 0, stderr[-3000:]

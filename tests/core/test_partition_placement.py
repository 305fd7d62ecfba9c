"""Placement of partitioned operators (issue #41 point 5): Algorithm 5 (Hwang §V-A) per partition.

A partitioned operator is ``p`` placement nodes ``"op.P"``, each with ``1/p`` of the load and its
share of every stream. Checked against computations written here from the query and the physical
plan (every stream replica of :meth:`PhysicalPlan.streams`), not from the problem's own flows. No Ray.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from replistream import Query
from replistream.network import default_servers
from replistream.partition import parse_partition_label
from replistream.placement import (ENTRY, PlacementError, PlacementPolicy, QueryStats, min_cost, place,
                                   problem_from_query, with_stats)
from replistream.plan import PhysicalPlan
from replistream.testing import assert_same_output, run_reference
from replistream.workloads import fig1_query

SERVERS = [s.name for s in default_servers(6)]
LAT = np.array([[abs(i - j) * 20.0 + (5.0 if i != j else 0.0) for j in range(6)] for i in range(6)])  # a line


def fig1_stats(q, loads=None):
    return QueryStats.estimate(q, source_rate={s: 1.0 + i for i, s in enumerate(q.sources)},
                               selectivity={"correlate": 2.0, "hot": 0.5}, loads=loads)


def independent_cost(q, stats, placement: dict, parallelism: dict, sources: dict, latency=LAT, names=SERVERS):
    """Sum of rate x latency over every stream replica of the physical plan: a stream replica from
    a replica of partition i of u (p_u partitions) into a replica of partition j of v (p_v) carries
    rate(u) / (p_u x p_v); sources' streams reach every entry replica whole."""
    idx = {s: i for i, s in enumerate(names)}
    plan = PhysicalPlan(q, placement, parallelism=parallelism)
    total = 0.0
    for e in plan.streams():
        rate = stats.rates[e.stream] / plan.partitions(e.src.node) / plan.partitions(e.dst.node)
        total += rate * latency[idx[plan.server(e.src)], idx[plan.server(e.dst)]]
    for src, srv in sources.items():
        for r in plan.replicas(ENTRY):
            total += stats.rates[src] * latency[idx[srv], idx[plan.server(r)]]
    return total


def test_partition_nodes_loads_and_flows_add_up_to_the_operator():
    q = fig1_query(3)
    stats = fig1_stats(q, loads={"entry": 0.1, "loads": 0.3, "pings": 0.2, "correlate": 0.9, "hot": 0.6})
    par = {"correlate": 3, "hot": 2, "loads": 2}
    whole = problem_from_query(q, SERVERS, LAT, stats, sources={"load_0": "boston"})
    split = problem_from_query(q, SERVERS, LAT, stats, sources={"load_0": "boston"}, parallelism=par)
    assert split.parallelism == par and whole.parallelism == {}
    assert set(split.nodes) == (set(whole.nodes) - set(par)) | {f"{op}.{i}" for op, p in par.items()
                                                                  for i in range(p)}
    for op, p in par.items():
        parts = [f"{op}.{i}" for i in range(p)]
        assert all(split.load[x] == pytest.approx(whole.load[op] / p) for x in parts)
        assert sum(split.load[x] for x in parts) == pytest.approx(whole.load[op])
    # flows, summed back onto the operators, are the unpartitioned flows; every pair is connected
    summed: dict = {}
    for f in split.flows:
        key = (parse_partition_label(f.src)[0], parse_partition_label(f.dst)[0])
        summed[key] = summed.get(key, 0.0) + f.rate
    assert summed == pytest.approx({(f.src, f.dst): f.rate for f in whole.flows})
    pairs = {(f.src, f.dst) for f in split.flows}
    assert {(f"loads.{i}", f"correlate.{j}") for i in range(2) for j in range(3)} <= pairs
    assert {(f"correlate.{i}", f"hot.{j}") for i in range(3) for j in range(2)} <= pairs
    assert {("hot.0", "alerts"), ("hot.1", "alerts"), (ENTRY, "pings")} <= pairs
    # every partition where its operator is: the cost and bandwidth of the unpartitioned plan
    plan = min_cost(whole, 2, d_min=0, alpha=np.inf, initial="greedy").plan()
    same = {**{n: v for n, v in plan.items() if n not in par},
            **{f"{op}.{i}": plan[op] for op, p in par.items() for i in range(p)}}
    assert split.network_cost(same) == pytest.approx(whole.network_cost(plan))
    assert split.bandwidth(same) == pytest.approx(whole.bandwidth(plan))
    assert with_stats(split, q, fig1_stats(q)).parallelism == par  # new statistics keep the partitions


def test_one_partition_is_the_operator_itself():
    q = fig1_query(2)
    a = problem_from_query(q, SERVERS, LAT, fig1_stats(q), parallelism={"correlate": 1})
    b = problem_from_query(q, SERVERS, LAT, fig1_stats(q))
    assert a.nodes == b.nodes and a.flows == b.flows and a.parallelism == {}


def window_query():
    q = Query("q")
    s = q.source("s", {"k": "i8"})
    s.window(10, by="k", name="w").sink("out")
    return q.build()


@pytest.mark.parametrize("p, k, load", [(2, 2, 1.2), (3, 2, 1.5), (2, 3, 1.0)])
def test_algorithm5_places_partitions_an_operator_too_heavy_for_one_server(p, k, load):
    """The whole operator exceeds alpha x capacity on every server: no placement. Its partitions fit,
    each partition's k replicas on distinct servers and every server below alpha (checked here)."""
    q = window_query()
    stats = QueryStats.estimate(q, loads={"w": load, "entry": 0.05})
    alpha = 0.8
    with pytest.raises(PlacementError, match="fails? the load constraint"):
        min_cost(problem_from_query(q, SERVERS, LAT, stats), k, alpha=alpha, d_min=0)
    problem = problem_from_query(q, SERVERS, LAT, stats, parallelism={"w": p})
    for initial in ("spring", "greedy"):
        pl = min_cost(problem, k, alpha=alpha, d_min=0, initial=initial)
        plan = pl.plan()
        assert "w" not in plan and sorted(n for n in plan if n.startswith("w.")) == [f"w.{i}" for i in range(p)]
        for i in range(p):
            assert len(plan[f"w.{i}"]) == k and len(set(plan[f"w.{i}"])) == k, plan
        used = {s: 0.0 for s in SERVERS}
        for node, where in plan.items():
            per = {"entry": 0.05}.get(node, load / p if node.startswith("w.") else 0.0)
            for s in where:
                used[s] += per
        assert max(used.values()) < alpha, used
        # the plan deploys: every partition replica where the plan says
        phys = PhysicalPlan(q, plan, k=None, parallelism={"w": p})
        assert [phys.server(r) for r in phys.replicas("w.1")] == plan["w.1"]


def test_random_and_non_replicated_take_the_partitioned_problem():
    q = window_query()
    problem = problem_from_query(q, SERVERS, LAT, QueryStats.estimate(q, loads={"w": 1.2}), parallelism={"w": 2})
    r = place(problem, 2, "random", seed=3, alpha=0.8)
    assert {n for n in r.plan() if n.startswith("w")} == {"w.0", "w.1"}
    assert all(len(set(r.plan()[f"w.{i}"])) == 2 for i in range(2))
    one = place(problem, 1, "non-replicated", alpha=0.8)
    assert one.plan()["w.0"] != one.plan()["w.1"]  # 0.6 + 0.6 >= 0.8: the halves cannot share a server


def test_network_cost_with_partitions_matches_the_physical_plan_and_ranks_a_worse_plan_higher():
    q = fig1_query(3)
    stats = fig1_stats(q, loads={"correlate": 1.0})
    par = {"correlate": 2, "hot": 2}
    sources = {s: SERVERS[i % 3] for i, s in enumerate(q.sources)}
    problem = problem_from_query(q, SERVERS, LAT, stats, sources=sources, parallelism=par)
    best = min_cost(problem, 2, alpha=0.8, d_min=10)
    plan = best.plan()
    assert best.network_cost == pytest.approx(independent_cost(q, stats, plan, par, sources))
    # hand-placed worse: the partitions of correlate moved to the far end of the line
    worse = dict(plan, **{"correlate.0": [SERVERS[5], SERVERS[4]], "correlate.1": [SERVERS[4], SERVERS[5]]})
    cost_worse = independent_cost(q, stats, worse, par, sources)
    assert problem.network_cost(worse) == pytest.approx(cost_worse)
    assert cost_worse > best.network_cost * 1.05
    # the policy's evaluate costs a plan with "op" keys as every partition on the operator's servers
    collapsed = {n: v for n, v in worse.items() if not n.startswith("correlate.")} | {"correlate": worse["correlate.0"]}
    ev = PlacementPolicy(latency=LAT, stats=stats, sources=sources).evaluate(q, SERVERS, collapsed, parallelism=par)
    assert ev.replicas["correlate.1"] == worse["correlate.0"]
    assert ev.network_cost == pytest.approx(independent_cost(q, stats, collapsed, par, sources))


def test_stats_from_partitioned_metrics_equal_the_unpartitioned_ones():
    """Deployment metrics of a partitioned run (replicas "op.P#R", each link carrying a share) give
    the operator's whole rate and load."""
    q = fig1_query(1)
    flat = {"entry#0": {"links": [{"to": "loads#0", "port": 0, "tuples": 60},
                                  {"to": "pings#0", "port": 0, "tuples": 40}], "busy_seconds": 1.0},
            "loads#0": {"links": [{"to": "correlate#0", "port": 0, "tuples": 60}], "busy_seconds": 2.0},
            "pings#0": {"links": [{"to": "correlate#0", "port": 1, "tuples": 40}], "busy_seconds": 1.0},
            "correlate#0": {"links": [{"to": "hot#0", "port": 0, "tuples": 30}], "busy_seconds": 4.0},
            "hot#0": {"links": [{"to": "alerts", "port": 0, "tuples": 30}], "busy_seconds": 1.0}}
    split = {"entry#0": {"links": [{"to": "loads#0", "port": 0, "tuples": 60},
                                   {"to": "pings#0", "port": 0, "tuples": 40}], "busy_seconds": 1.0},
             "entry#1": {"links": [{"to": "loads#0", "port": 0, "tuples": 60},
                                   {"to": "pings#0", "port": 0, "tuples": 40}], "busy_seconds": 1.0},
             "loads#0": {"links": [{"to": "correlate.0#0", "port": 0, "tuples": 25},
                                   {"to": "correlate.0#1", "port": 0, "tuples": 25},
                                   {"to": "correlate.1#0", "port": 0, "tuples": 35}], "busy_seconds": 2.0},
             "pings#0": {"links": [{"to": "correlate.0#0", "port": 1, "tuples": 10},
                                   {"to": "correlate.1#0", "port": 1, "tuples": 30}], "busy_seconds": 1.0},
             "correlate.0#0": {"links": [{"to": "hot#0", "port": 0, "tuples": 12}], "busy_seconds": 1.5},
             "correlate.0#1": {"links": [{"to": "hot#0", "port": 0, "tuples": 12}], "busy_seconds": 1.5},
             "correlate.1#0": {"links": [{"to": "hot#0", "port": 0, "tuples": 18}], "busy_seconds": 2.5},
             "hot#0": {"links": [{"to": "alerts", "port": 0, "tuples": 30}], "busy_seconds": 1.0}}
    a = QueryStats.from_metrics(q, {"actors": flat}, 10.0, row_bytes=False)
    b = QueryStats.from_metrics(q, {"actors": split}, 10.0, row_bytes=False)
    assert b.rates == pytest.approx(a.rates)
    assert b.loads == pytest.approx(a.loads)


def test_resolve_places_partitions_by_the_policy_and_spread_by_hand():
    """Ray-free: what deploy(placement=..., parallelism=...) resolves before any actor starts."""
    from replistream.engines.ray.resolve import resolve_placement_with_cost, resolve_servers, spread_partitions

    q = fig1_query(2)
    servers = resolve_servers(6)
    par = {"correlate": 2, "hot": 3}
    plan, placed = resolve_placement_with_cost(q, servers, 2, "min-cost", None, par)
    policy = PlacementPolicy("min-cost")
    want = policy.placement(q, servers, 2, None, parallelism=par)
    assert plan == want.plan() and placed.plan() == plan
    assert {n for n in plan if n.startswith(("correlate", "hot"))} == {"correlate.0", "correlate.1", "hot.0",
                                                                          "hot.1", "hot.2"}
    assert placed.problem.parallelism == par
    # a policy with loads: the halves of a heavy join are spread by Algorithm 5's load test
    heavy = PlacementPolicy("min-cost", stats=QueryStats.estimate(q, loads={"correlate": 1.2}), d_min=0)
    plan, placed = resolve_placement_with_cost(q, servers, 2, heavy, None, {"correlate": 2})
    assert not set(plan["correlate.0"]) & set(plan["correlate.1"])
    assert plan == heavy.placement(q, servers, 2, None, parallelism={"correlate": 2}).plan()
    # "spread" still places the operator and spreads its partitions by hand
    plan, placed = resolve_placement_with_cost(q, servers, 2, "spread", None, par)
    assert placed is None
    names = [s.name for s in servers]
    assert {n: plan[n] for n in plan if "." in n} == spread_partitions(plan, names, 2, par)
    # a deployment's {op: 1} (keep_single) is the operator itself for the policy
    plan, _ = resolve_placement_with_cost(q, servers, 2, "min-cost", None, {"correlate": 1})
    assert "correlate" in plan and "correlate.0" not in plan


def test_simulator_runs_the_per_partition_placement_exactly():
    """fig1_setting(parallelism=) places partitions with Algorithm 5 per partition and its runs route
    to them: the output equals the reference, each partition's replicas on the servers placed."""
    from replistream.sim.experiments import _simulate, fig1_setting

    st = fig1_setting(n_servers=6, monitored=2, duration_s=60, seed=1, parallelism={"correlate": 2, "hot": 2},
                      loads={"correlate": 1.2})
    pl = min_cost(st.problem, 2, alpha=0.8)
    plan = pl.plan()
    assert not set(plan["correlate.0"]) & set(plan["correlate.1"])  # 0.6 + 0.6 >= 0.8
    res = _simulate(st, plan)
    assert res.complete
    assert_same_output(run_reference(st.query, st.inputs).outputs["alerts"], res.outputs["alerts"])
    from replistream.sim import Simulator

    sim = Simulator(st.query, plan, st.network, sources=st.sources, parallelism=st.parallelism)
    for part in ("correlate.0", "correlate.1", "hot.1"):
        assert [sim.physical.server(r) for r in sim.physical.replicas(part)] == plan[part]
    assert list(itertools.chain(*(plan[f"correlate.{i}"] for i in range(2)))) == \
        [sim.physical.server(r) for r in sim.physical.replicas("correlate")]

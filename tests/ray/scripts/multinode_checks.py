"""Replistream on a real multi-node Ray cluster (ray.cluster_utils.Cluster), two checks on one cluster
(starting a cluster costs tens of seconds, so both checks share it).

``placement``: min-cost placement on 3 Ray nodes. Six logical servers, two per
Ray node, each node addressed a different way: the head node by node id, one
worker by a node label, one by a custom resource. The Fig. 1 query is deployed
with ``placement=`` a min-cost policy (k=3, d_min=30 ms: the two servers on a
node are closer than that, so every operator gets one replica per node).
Checks that the deployed plan is the pure function's placement, that every
actor runs on its server's Ray node, that the coordinator reports the plan's
network cost, and that the output equals the ideal run.

``partitions_on_nodes``: then a fourth node joins; a keyed window run as 4 partitions (k=1), one
server per node: each partition on its own Ray node (the default placement spreads partitions),
the output equal to the reference.

``node_removed``: on the same four nodes, one server per node, the Fig. 1
query with k=2, and the Ray node of one join replica's server is removed
mid-run; the application output must equal the reference exactly.

Prints one JSON line per check (``"check"`` names it); exits 0 when all hold.
Run by tests/ray/conftest.py (``multinode_results``) in its own process: it needs its own Ray.
"""
import json
import random
import sys

import ray
from ray.cluster_utils import Cluster

from replistream import Server
from replistream.network import city
from replistream.placement import PlacementPolicy, cluster_servers, fig1_sources
from replistream.engines.ray import RAY_SYSTEM_CONFIG, deploy
from replistream.testing import KillServer, as_multiset, run_reference
from replistream.workloads import fig1_inputs, fig1_query


def placement(cluster, labelled, resourced, seed: int) -> tuple[dict, bool]:
    head = cluster.head_node
    pins = {  # server -> (Server.node spec, the Ray node it must land on)
        "boston": (head.node_id, head.node_id), "newyork": (head.node_id, head.node_id),
        "london": ("label:replistream.node=europe", labelled.node_id),
        "paris": ("label:replistream.node=europe", labelled.node_id),
        "tokyo": ("resource:node_asia", resourced.node_id), "seoul": ("resource:node_asia", resourced.node_id),
    }
    servers = []
    for name in ["boston", "london", "tokyo", "newyork", "paris", "seoul"]:
        c = city(name)
        servers.append(Server(name, c.lat, c.lon, node=pins[name][0]))
    # servers made from the cluster itself: two per node by node id, or one per labelled node
    by_id = cluster_servers(per_node=2)
    by_label = cluster_servers(label="replistream.node")
    cluster_view = {
        "by_id": [[s.name, s.node] for s in by_id],
        "by_id_ok": [s.node for s in by_id] == [head.node_id] * 2 + sorted([labelled.node_id] * 2 +
                                                                           [resourced.node_id] * 2),
        "by_label": [[s.name, s.node] for s in by_label],
        "by_label_ok": any(s.name == "europe" and s.node == "label:replistream.node=europe" for s in by_label),
    }
    q = fig1_query(n_servers=3, window_s=3.0, punctuate_s=1.0)
    data = fig1_inputs(n_servers=3, duration_s=40, period_s=1.0, seed=seed, chunk=10)
    policy = PlacementPolicy("min-cost", sources=fig1_sources, d_min=30.0)
    offline = policy.placement(q, servers, 3)
    dep = deploy(q, servers=servers, k=3, placement=policy, network="geo-static", cluster=cluster)
    placed = {label: ray.get(h.node_id.remote(), timeout=60) for label, h in dep.handles.items()}
    wrong = {label: n for label, n in placed.items() if n != pins[dep.actor_server[label]][1]}
    per_node = {}
    for node in q.operators + ["entry"]:
        per_node[node] = sorted(pins[s][1][:8] for s in dep.plan[node])
    coordinator_cost = ray.get(dep.coordinator.network_cost.remote(), timeout=60)
    ref = run_reference(q, data)
    res = dep.run(data, timeout=240)
    e, g = as_multiset(ref.outputs["alerts"]), as_multiset(res.outputs["alerts"])
    out = {
        "nodes": 3, "misplaced_actors": wrong, "actors": len(placed),
        "plan": dep.plan, "plan_is_offline_placement": dep.plan == offline.plan(),
        "one_replica_per_node": all(len(set(v)) == 3 for v in per_node.values()),
        "coordinator_network_cost": coordinator_cost, "offline_network_cost": offline.network_cost,
        "outputs": len(res.outputs["alerts"]), "reference_outputs": len(ref.outputs["alerts"]),
        "matches_reference": e == g, "complete": res.complete, "cluster_servers": cluster_view,
    }
    dep.shutdown()
    ok = (not wrong and out["plan_is_offline_placement"] and out["one_replica_per_node"] and out["matches_reference"]
          and out["complete"] and abs(coordinator_cost - offline.network_cost) <= 1e-6 * offline.network_cost
          and cluster_view["by_id_ok"] and cluster_view["by_label_ok"])
    return out, ok


def node_removed(cluster, nodes, seed: int) -> tuple[dict, bool]:
    names = ["boston", "london", "tokyo", "sydney"]
    servers = []
    for name, node in zip(names, nodes):
        c = city(name)
        servers.append(Server(name, c.lat, c.lon, node=node.node_id))
    q = fig1_query(n_servers=3, window_s=3.0, punctuate_s=1.0)
    data = fig1_inputs(n_servers=3, duration_s=60, period_s=1.0, seed=seed, chunk=5)
    # entry points and operators on the worker nodes, the application on the head node
    plan = {"entry": ["london", "tokyo"], "loads": ["tokyo", "sydney"], "pings": ["london", "sydney"],
            "correlate": ["london", "tokyo"], "hot": ["tokyo", "sydney"], "alerts": ["boston"]}
    dep = deploy(q, servers=servers, k=2, placement=plan, cluster=cluster)
    # where every actor actually runs
    placed = {}
    for label, h in dep.handles.items():
        placed[label] = ray.get(h.node_id.remote(), timeout=60)
    wrong = {l: n for l, n in placed.items() if n != dep.servers[dep.actor_server[l]].node}
    victim = "london"  # hosts entry#0, pings#0 and correlate#0
    rng = random.Random(seed)
    src = rng.choice(sorted(data))
    feed = {s: list(v) for s, v in data.items()}
    feed[src].insert(len(feed[src]) // 2, KillServer(victim))
    ref = run_reference(q, data)
    res = dep.run(feed, timeout=180)
    e, g = as_multiset(ref.outputs["alerts"]), as_multiset(res.outputs["alerts"])
    alive_nodes = sum(1 for n in ray.nodes() if n["Alive"])
    out = {
        "nodes": len(nodes), "alive_nodes_after": alive_nodes, "misplaced_actors": wrong,
        "outputs": len(res.outputs["alerts"]), "reference_outputs": len(ref.outputs["alerts"]),
        "lost": sum((e - g).values()), "extra": sum((g - e).values()),
        "matches_reference": e == g, "complete": res.complete,
        "killed": [ev for ev in dep.events if ev.get("event") == "dead"],
    }
    dep.shutdown()
    ok = out["matches_reference"] and out["complete"] and not wrong and alive_nodes == len(nodes) - 1
    return out, ok


def partitions_on_nodes(cluster, nodes, seed: int) -> tuple[dict, bool]:
    """A keyed window run as 4 partitions (k=1) on four servers, one per Ray node: the default
    placement puts each partition on its own server, so on its own node (issue #41)."""
    import numpy as np

    from replistream import Query, seconds

    names = ["boston", "london", "tokyo", "sydney"]
    servers = [Server(name, city(name).lat, city(name).lon, node=node.node_id) for name, node in zip(names, nodes)]
    q = Query("parts")
    s = q.source("s", {"k": "i8"}, punctuate_every=seconds(1))
    s.window(size=seconds(2), by="k", aggs={"n": "count"}, name="per_k").sink("out")
    q = q.build()
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(30), 20_000))
    data = {"s": [{"ts": ts[a:a + 500], "k": rng.integers(0, 300, 500)} for a in range(0, len(ts), 500)]}
    dep = deploy(q, servers=servers, k=1, parallelism={"per_k": 4}, cluster=cluster)
    where = {label: ray.get(h.node_id.remote(), timeout=60) for label, h in dep.handles.items() if label.startswith("per_k.")}
    res = dep.run(data, timeout=180)
    dep.shutdown()
    ref = run_reference(q, data)
    e, g = as_multiset(ref.outputs["out"]), as_multiset(res.outputs["out"])
    out = {"partition_nodes": where, "distinct_nodes": len(set(where.values())), "partitions": len(where),
           "matches_reference": e == g, "complete": res.complete, "outputs": len(res.outputs["out"])}
    return out, out["distinct_nodes"] == 4 and e == g and res.complete


def main(seed: int = 0) -> int:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": RAY_SYSTEM_CONFIG})
    labelled = cluster.add_node(num_cpus=1, labels={"replistream.node": "europe"})
    resourced = cluster.add_node(num_cpus=1, resources={"node_asia": 1})
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    cluster.wait_for_nodes()
    oks = []
    try:
        out, ok = placement(cluster, labelled, resourced, seed)
        print(json.dumps({"check": "placement", **out}), flush=True)
        oks.append(ok)
        extra = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        out, ok = partitions_on_nodes(cluster, [cluster.head_node, labelled, resourced, extra], seed + 2)
        print(json.dumps({"check": "partitions_on_nodes", **out}), flush=True)
        oks.append(ok)
        out, ok = node_removed(cluster, [cluster.head_node, labelled, resourced, extra], seed + 1)
        print(json.dumps({"check": "node_removed", **out}), flush=True)
        oks.append(ok)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0 if len(oks) == 3 and all(oks) else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))

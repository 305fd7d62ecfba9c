"""Min-cost placement on a real 3-node Ray cluster (ray.cluster_utils.Cluster).

Six logical servers, two per Ray node, each node addressed a different way:
the head node by node id, one worker by a node label, one by a custom
resource. The Fig. 1 query is deployed with ``placement=`` a min-cost
policy (k=3, d_min=30 ms: the two servers on a node are closer than that, so
every operator gets one replica per node). Checks that the deployed plan is
the pure function's placement, that every actor runs on its server's Ray
node, that the coordinator reports the plan's network cost, and that the
output equals the ideal run. Prints one JSON line; exits 0 when all hold.
Run by tests/ray/test_placement_ray.py in its own process (it needs its own Ray).
"""
import json
import sys

import ray
from ray.cluster_utils import Cluster

from replistream import Server
from replistream.network import city
from replistream.placement import PlacementPolicy, cluster_servers, fig1_sources
from replistream.engines.ray import RAY_SYSTEM_CONFIG, deploy
from replistream.testing import as_multiset, run_reference
from replistream.workloads import fig1_inputs, fig1_query


def main(seed: int = 0) -> int:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": RAY_SYSTEM_CONFIG})
    labelled = cluster.add_node(num_cpus=1, labels={"replistream.node": "europe"})
    resourced = cluster.add_node(num_cpus=1, resources={"node_asia": 1})
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    cluster.wait_for_nodes()
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
    placed = {label: ray.get(h.node_id.remote()) for label, h in dep.handles.items()}
    wrong = {label: n for label, n in placed.items() if n != pins[dep.actor_server[label]][1]}
    per_node = {}
    for node in q.operators + ["entry"]:
        per_node[node] = sorted(pins[s][1][:8] for s in dep.plan[node])
    coordinator_cost = ray.get(dep.coordinator.network_cost.remote())
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
    print(json.dumps(out))
    dep.shutdown()
    ray.shutdown()
    cluster.shutdown()
    ok = (not wrong and out["plan_is_offline_placement"] and out["one_replica_per_node"] and out["matches_reference"]
          and out["complete"] and abs(coordinator_cost - offline.network_cost) <= 1e-6 * offline.network_cost
          and cluster_view["by_id_ok"] and cluster_view["by_label_ok"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))

"""Replication transparency on a real multi-node Ray cluster (ray.cluster_utils.Cluster).

Four Ray nodes on this machine, one per server; the Fig. 1 query with k=2; the
Ray node of one join replica's server is removed mid-run. Prints one JSON line
and exits 0 when the application output equals the reference exactly.
Run by tests/ray/test_multinode.py in its own process (it needs its own Ray cluster).
"""
import json
import random
import sys

import ray
from ray.cluster_utils import Cluster

from replistream import Server
from replistream.network import city
from replistream.engines.ray import RAY_SYSTEM_CONFIG, deploy
from replistream.testing import KillServer, as_multiset, run_reference
from replistream.workloads import fig1_inputs, fig1_query


def main(seed: int = 0) -> int:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": RAY_SYSTEM_CONFIG})
    workers = [cluster.add_node(num_cpus=1) for _ in range(3)]
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    cluster.wait_for_nodes()
    nodes = [cluster.head_node] + workers
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
        placed[label] = ray.get(h.node_id.remote())
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
    print(json.dumps(out))
    dep.shutdown()
    ray.shutdown()
    cluster.shutdown()
    ok = out["matches_reference"] and out["complete"] and not wrong and alive_nodes == len(nodes) - 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))

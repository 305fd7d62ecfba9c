"""Issue #29 on Ray: a running cluster keeps a warm pool of actor processes between scripts
(replistream/engines/ray/warm.py). A script that joins the cluster takes its actors from it (and
gets the reference output); actors leased to a taker that ended are killed by the pool."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import ray

from replistream.engines.ray import warm

pytestmark = pytest.mark.usefixtures("ray_session")

DRIVER = r"""
import json, sys
import numpy as np
import replistream as rs
from replistream.engines.ray import deploy, init_ray, warm
import ray
init_ray(address=sys.argv[1])
q = rs.Query("warm-test")
s = q.source("events", {"key": "i8", "x": "f8"})
s.filter(lambda t: t["x"] >= 0.5, name="big").window(1_000_000, by="key", aggs={"n": "count"}, name="per_key").sink("out")
q = q.build()
rng = np.random.default_rng(0)
data = np.zeros(2000, dtype=[("ts", "i8"), ("key", "i8"), ("x", "f8")])
data["ts"] = np.arange(2000) * 1000
data["key"], data["x"] = rng.integers(0, 10, 2000), rng.random(2000)
warm.start()
warm.wait_warm(120)
before = ray.get(warm._keeper().stats.remote(), timeout=60)["taken"]
with deploy(q, servers=2, k=1, network="zero") as dep:
    res = dep.run({"events": [data]}, timeout=120)
big = data[data["x"] >= 0.5]
want = {}
for ts, key in zip(big["ts"] // 1_000_000, big["key"]):
    want[f"{ts},{key}"] = want.get(f"{ts},{key}", 0) + 1
got = {f"{w // 1_000_000},{k}": int(n) for w, k, n in zip(res.outputs["out"]["window_start"], res.outputs["out"]["key"],
                                                           res.outputs["out"]["n"])}
print(json.dumps({"exact": got == want, "taken": ray.get(warm._keeper().stats.remote(), timeout=60)["taken"] - before}))
"""


def _address() -> str:
    port = ray.get_runtime_context().gcs_address.rpartition(":")[2]  # the session's Ray listens on loopback only
    return f"127.0.0.1:{port}"


def test_a_script_that_joins_the_cluster_takes_warm_actors_and_gets_the_reference_output():
    env = {**os.environ, "RAY_ADDRESS": _address(), "REPLISTREAM_CLUSTER_POOL": "5"}
    out = subprocess.run([sys.executable, "-c", DRIVER, _address()], env=env, capture_output=True, text=True,
                         timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    r = json.loads(lines[-1])
    assert r["exact"]
    assert r["taken"] >= 1  # at least one of its actors was a warm one from the cluster's pool


def test_the_pool_kills_an_actor_leased_to_a_taker_that_died():
    keeper = warm.WarmPool.remote(2)  # a pool of this test's own (not the cluster's named one)
    try:
        deadline = time.time() + 120
        while not ray.get(keeper.stats.remote(), timeout=30)["idle"]["ReplicaActor"]:
            assert time.time() < deadline, ray.get(keeper.stats.remote(), timeout=30)
            time.sleep(0.2)

        @ray.remote(num_cpus=0)
        class Taker:
            def me(self):
                return ray.get_runtime_context().get_actor_id()

        taker = Taker.remote()
        owner = ray.get(taker.me.remote(), timeout=60)
        leased = ray.get(keeper.take.remote("ReplicaActor", f"actor:{owner}"), timeout=30)
        assert leased is not None and ray.get(leased.stop_sending.remote(), timeout=30)
        assert ray.get(keeper.take.remote("NoSuchActor", f"actor:{owner}"), timeout=30) is None
        ray.kill(taker)
        deadline = time.time() + 60
        while True:  # reaped within a few of its one-second rounds
            try:
                ray.get(leased.stop_sending.remote(), timeout=10)
            except ray.exceptions.RayActorError:
                break
            assert time.time() < deadline, f"the leased actor outlived its dead taker: {ray.get(keeper.stats.remote(), timeout=30)}"
            time.sleep(0.2)
        assert ray.get(keeper.stats.remote(), timeout=30)["reaped"] == 1
    finally:
        ray.get(keeper.shutdown.remote(), timeout=60)
        ray.kill(keeper)

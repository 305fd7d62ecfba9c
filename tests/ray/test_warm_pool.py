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
    # a pool of this test's own (not the cluster's named one), which keeps its actors apart: sharing
    # the named pool's, it took up that pool's idle actors when it started and killed them at its end
    keeper = warm.WarmPool.remote(2, "replistream/warm-test-own/")
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


FILES_DRIVER = r"""
import json, sys, tempfile
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import replistream as rs
from replistream import files
from replistream.engines.ray import deploy, init_ray, warm
from replistream.testing import run_reference
import ray
init_ray(address=sys.argv[1])
folder = tempfile.mkdtemp()
rng = np.random.default_rng(1)
for i in range(3):
    pq.write_table(pa.table({"t": i * 1_000_000 + np.arange(1500) * 600, "key": rng.integers(0, 7, 1500)}),
                   f"{folder}/part-{i}.parquet")
q = rs.Query("warm-files")
rs.FileSource(folder, time="t").declare(q, "load", punctuate_every=100_000).window(
    500_000, by="key", aggs={"n": "count"}, name="per_key").sink("out")
q = q.build()
warm.start()
warm.wait_warm(120)
with deploy(q, servers=2, k=1, network="zero") as dep:
    res = dep.run({"load": rs.FileSource(folder, time="t")}, timeout=120)
ref = run_reference(q, {"load": rs.FileSource(folder, time="t")})
key = lambda o: sorted(zip(o["window_start"].tolist(), o["key"].tolist(), o["n"].tolist()))
print(json.dumps({"exact": key(res.outputs["out"]) == key(ref.outputs["out"]),
                  "reader": files.reader() is not None}))
print(ray.get(warm._keeper().stats.remote(), timeout=60), file=sys.stderr)
"""


def test_a_script_that_joins_the_cluster_reads_its_files_through_a_warm_reader():
    """Issue #42: joined to a cluster, the first file read of a script waited for a new Ray worker
    process of its own job; the pool keeps a reader process warm, and deploy() takes it."""
    env = {**os.environ, "RAY_ADDRESS": _address(), "REPLISTREAM_CLUSTER_POOL": "5"}
    out = subprocess.run([sys.executable, "-c", FILES_DRIVER, _address()], env=env, capture_output=True, text=True,
                         timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    assert json.loads(lines[-1]) == {"exact": True, "reader": True}, out.stderr[-2000:]

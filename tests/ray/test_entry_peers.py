"""Entry points hold their input for their peers (Hwang §III): an entry replica that missed chunks
(the feeder stopped sending to it while it did not answer) takes them from a peer entry replica
when it answers again, and the output stays exact; chunks no peer holds any more are a loud error
that names the replica, the source and the chunks (issue #29, docs/reliability.md)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import ray

from replistream import Query, deploy, seconds
from replistream.sources import Call, StopReplica, inject_at
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")

SERVERS = ["boston", "london", "tokyo"]


def query():
    q = Query("peers")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(2), by="k", aggs={"n": "count", "sv": ("v", "sum")}, name="per_k").sink("out")
    return q.build()


def inputs(n=3000, span_s=30, chunk=50, seed=4):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(span_s), n))
    k, v = rng.integers(0, 8, n), rng.normal(size=n)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, n, chunk)]}


def skips(dep, label, what):
    return [s for s in list(dep.feeder.skips) if s[1] == label and s[2] == what]


def test_an_entry_replica_that_missed_chunks_while_stopped_takes_them_from_a_peer():
    q = query()
    data = inputs()
    ref = run_reference(q, data)
    resumed = threading.Event()

    def resume_once_skipped(dep):
        def go():
            deadline = time.time() + 60
            while not skips(dep, "entry#1", "skipped") and time.time() < deadline:
                time.sleep(0.02)
            dep.resume_replica("entry", 1)
            resumed.set()
        threading.Thread(target=go, daemon=True).start()  # the feeder thread must go on meanwhile

    data["s"] = inject_at(data["s"], seconds(4), StopReplica("entry", 1))
    data["s"] = inject_at(data["s"], seconds(4), Call(resume_once_skipped))
    with deploy(q, servers=SERVERS, k=2, suspect_after_s=0.5, fail_after_s=120.0) as dep:
        dep.feeder.max_lag = 4  # a few queued calls, then the feeder stops sending to it
        res = dep.run(data, pace=4.0, timeout=120)
        assert resumed.wait(60) and skips(dep, "entry#1", "skipped"), f"entry#1 was never skipped: {dep.feeder.skips}"
        deadline = time.time() + 60
        while not skips(dep, "entry#1", "caught up"):
            assert time.time() < deadline, (f"entry#1 never caught up from its peer: {dep.feeder.skips}, catching {dep.feeder.catching}, "
                                            f"feeder error {dep.feeder.error!r}, events {dep.events[-5:]}")
            time.sleep(0.05)
        h1, h0 = dep.topology.handle("entry#1"), dep.topology.handle("entry#0")
        st = ray.get(h1.stats.remote(), timeout=30)
        assert st["recovered_chunks"] > 0
        assert dep.topology.is_running("entry#1")
        assert not [e for e in dep.events if e.get("event") in ("declared_failed", "dead")]
        # both replicas took every chunk, the stopped one partly from its peer
        assert ray.get(h1.probe.remote(), timeout=30)["position"] == ray.get(h0.probe.remote(), timeout=30)["position"]
        # chunks no peer holds any more: a loud error naming the replica, the source and the chunks
        with pytest.raises(ray.exceptions.RayTaskError, match=r"entry#0: chunks \d+\.\.\d+ of 's' are held by no live"):
            ray.get(h0.catch_up.remote({"s": 10 ** 6}, [h1]), timeout=30)
    assert res.complete
    assert_same_output(ref.outputs["out"], res.outputs["out"])

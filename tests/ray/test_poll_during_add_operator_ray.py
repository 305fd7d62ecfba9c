"""A poll of the applications that comes while ``add_operator`` is adding one: the new application's
replica is in the topology (and has a fetch outstanding) before the deployment's query names it
(``dep.query`` changes after the links among the new replicas open). An empty fetch from it must
add nothing, without asking the query for its schema: it once did (results.joined took an empty
array of the application's schema), and a clean-clone CI failed with ``KeyError: 'raw_counts'`` in
tests/ray/test_changes_partitions_ray.py when the background poll hit that window. Here the poll is
made inside the window, deterministically: on the thread making the change, right after the new
application's replica is attached to the topology."""
from __future__ import annotations

import numpy as np
import pytest

from replistream import Query, deploy, run_reference, seconds
from replistream.testing import Call, assert_same_output, inject_at

pytestmark = pytest.mark.usefixtures("ray_session")


def test_a_poll_between_the_topology_and_the_query_naming_a_new_application(monkeypatch):
    q = Query("poll_during_add")
    s = q.source("s", {"k": "i8", "x": "f8"}, punctuate_every=seconds(0.5))
    s.filter(lambda t: t["x"] > 0.3, name="hot").sink("out")
    rng = np.random.default_rng(3)
    ts = np.arange(200, dtype=np.int64) * seconds(0.05)
    data = {"s": [{"ts": ts[i:i + 10], "k": rng.integers(0, 5, 10), "x": rng.random(10)} for i in range(0, 200, 10)]}
    polled = []
    with deploy(q.build(), servers=2, k=1, network="zero", progress=False) as dep:
        plane = dep._backend.plane
        attach = plane.topology.attach

        def attach_then_poll(label, handle):
            attach(label, handle)
            if label == "late":
                assert "late" not in plane.query.graph  # (the window this test is about)
                plane.output.poll(wait_s=5.0)  # the new replica answers its first fetch: nothing yet
                polled.append(label)

        monkeypatch.setattr(plane.topology, "attach", attach_then_poll)
        s = inject_at(data["s"], seconds(4), Call(lambda d: d.add_operator("hot", lambda st: st.filter(lambda t: t["k"] > 1, name="late_k").sink("late"))))
        res = dep.run({"s": s}, pace=None, timeout=120)
        assert polled == ["late"]
        assert res.complete, res.punctuation
        ref = run_reference(dep.query, data)
        for app in ("out", "late"):
            assert_same_output(ref.outputs[app], res.outputs[app])
        assert len(res.outputs["late"]) > 0

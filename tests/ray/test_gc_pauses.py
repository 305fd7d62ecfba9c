"""Python's garbage collector in the data-path actors (issue #42 point 1, engines/ray/gcpause.py):
every actor measures its collections' pauses, collects young objects at the raised threshold and
has frozen what it built at set-up, so later full collections do not walk it again."""
from __future__ import annotations

import numpy as np
import pytest
import ray

import replistream as rs
from replistream.engines.ray import deploy
from replistream.engines.ray.gcpause import THRESHOLDS
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")


def test_every_data_path_actor_measures_its_collections_and_has_frozen_its_setup():
    rng = np.random.default_rng(7)
    n = 20_000
    cols = {"ts": np.sort(rng.integers(0, 2_000_000, n)), "key": rng.integers(0, 50, n)}
    q = rs.Query("gcpauses")
    s = q.source("s", {"key": "i8"}, punctuate_every=100_000)
    s.window(size=500_000, by="key", aggs={"n": "count"}, name="w").sink("out")
    q.build()
    with deploy(q, servers=2, k=1) as dep:
        res = dep.run({"s": cols}, chunk_size=500)
        stats = {label: ray.get(h.stats.remote(), timeout=30) for label, h in dep.handles.items()}
    assert_same_output(run_reference(q, {"s": cols}).outputs["out"], res.outputs["out"])
    assert {label.split("#")[0] for label in stats} >= {"entry", "w", "out"}
    for label, s in stats.items():
        g = s["gc"]
        assert g["tuned"] and g["thresholds"] == list(THRESHOLDS), label
        assert g["frozen"] > 1_000, (label, g["frozen"])  # Ray's and the modules' objects at least
        assert len(g["collections"]) == len(g["max_ms"]) == len(g["total_ms"]) == 3
        assert all(ms >= 0 for _, gen, ms in g["recent"]) and all(gen in (0, 1, 2) for _, gen, _ in g["recent"])
        assert sum(g["collections"]) == 0 or max(g["max_ms"]) > 0, label

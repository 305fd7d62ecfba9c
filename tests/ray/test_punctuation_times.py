"""Every replica remembers when its punctuation rose, in and out (issue #42: latency by hop,
bench/latency.py): a window's close can be followed from the entry points to the application."""
from __future__ import annotations

import numpy as np
import pytest
import ray

import replistream as rs
from replistream.engines.ray import deploy
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")


def test_a_window_close_is_followed_hop_by_hop_in_order():
    rng = np.random.default_rng(42)
    n = 6_000
    cols = {"ts": np.sort(rng.integers(0, 3_000_000, n)), "key": rng.integers(0, 30, n)}
    q = rs.Query("hops")
    s = q.source("s", {"key": "i8"}, punctuate_every=100_000)
    s.window(size=1_000_000, by="key", aggs={"n": "count"}, name="w").sink("out")
    q.build()
    ref = run_reference(q, {"s": cols})
    with deploy(q, servers=2, k=2) as dep:
        res = dep.run({"s": cols}, pace=20.0, chunk_size=1_000)
        times = {label: ray.get(h.punctuation_times.remote(), timeout=30) for label, h in dep.handles.items()}
    assert_same_output(ref.outputs["out"], res.outputs["out"])
    entries = [t for label, t in times.items() if label.startswith("entry#")]
    windows = [t for label, t in times.items() if label.startswith("w#")]
    apps = [t for label, t in times.items() if label.split("#")[0] == "out"]
    assert len(entries) == 2 and len(windows) == 2 and apps

    def first(pairs, p):
        return min((wall for q_, wall in pairs if q_ >= p), default=None)

    for end in (1_000_000, 2_000_000):  # the two windows that close before the end of the input
        for t in entries + windows + apps:
            assert first(t["in"], end - 1) is not None, (t["label"], end)
        for t in entries + windows:
            assert first(t["out"], end - 1) >= first(t["in"], end - 1), (t["label"], end)
            assert all(a[0] < b[0] for a, b in zip(t["out"], t["out"][1:])), "out rises"
        entry_out = min(first(t["out"], end - 1) for t in entries)
        window_in = min(first(t["in"], end - 1) for t in windows)
        window_out = min(first(t["out"], end - 1) for t in windows)
        app_in = min(first(t["in"], end - 1) for t in apps)
        assert entry_out <= window_in <= window_out <= app_in, end
        assert not [p for t in apps for p, _ in t["out"]], "an application emits nothing"

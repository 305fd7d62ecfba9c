"""An application replica writing a ParquetSink is busy but alive while its first commit waits for
Parquet's writer to load (seconds of imports on two loaded cores): with a short ``fail_after_s`` it
must not be declared failed while its peer goes ahead, and a really stopped one still is
(replistream.engines.ray.actors.SinkActor._await_parquet, docs/reliability.md "Slow is dead")."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import ray

from replistream import ParquetSink, Query, deploy, seconds
from replistream.sinks import MARKER
from replistream.sources import StopReplica, inject_at
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")

SERVERS = ["boston", "london", "tokyo"]
#: short bounds: the held replica's data path waits at least three times ``fail_after_s``
DETECT = {"suspect_after_s": 1.0, "fail_after_s": 2.0}


def query():
    q = Query("probes")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.filter(lambda b: b["v"] > -0.5, name="f").sink("pos")
    return q.build()


def inputs(n=2_000, chunk=50, seed=7):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(30), n))
    k, v = rng.integers(0, 8, n), rng.normal(size=n)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, n, chunk)]}


def held_sink(path: str, held: str | None, hold_s: float):
    """A ParquetSink whose replica ``held`` loads Parquet's writer only once its peer has linked the
    completion marker, and ``hold_s`` seconds after that: its first commit waits all that time.
    (A class defined here is pickled by value: the replicas' processes need not import this file.)"""

    class HeldWarmUp(ParquetSink):
        def _warm_up(self, label):
            if label == held:
                marker, seen, deadline = os.path.join(self.path, MARKER), None, time.monotonic() + 120
                pause = threading.Event()
                while time.monotonic() < deadline:
                    if seen is None and os.path.exists(marker):
                        seen = time.monotonic()
                    if seen is not None and time.monotonic() - seen >= hold_s:
                        break
                    pause.wait(0.05)
            ParquetSink._warm_up(self, label)

    return HeldWarmUp(path, every=seconds(3))


def events(dep, kind, actor=None):
    return [e for e in dep.events if e.get("event") == kind and (actor is None or e.get("actor") == actor)]


def test_a_replica_whose_first_commit_waits_for_parquet_is_not_declared_failed(tmp_path):
    q, data = query(), inputs()
    ref = run_reference(q, data)
    sink = held_sink(str(tmp_path / "pos"), held="pos", hold_s=3 * DETECT["fail_after_s"])
    with deploy(q, servers=SERVERS, k=2, app_replicas=2, sinks={"pos": sink}, **DETECT) as dep:
        res = dep.run(data, pace=None, timeout=180)
        try:
            done = ray.get(dep.topology.handle("pos").wait_done.remote(150), timeout=180)
        except ray.exceptions.RayActorError:  # killed: declared failed
            done = False
        assert done and not events(dep, "declared_failed"), events(dep, "declared_failed") or "pos never finished"
        st = ray.get(dep.topology.handle("pos").stats.remote(), timeout=30)["sink"]
        assert not events(dep, "suspected", "pos"), events(dep, "suspected", "pos")  # it answered, not busy
        assert dep.topology.is_running("pos")
    # the scenario happened: its data path waited for Parquet past fail_after_s while its peer
    # linked every file (and the marker) first
    assert st["warm_wait_s"] >= DETECT["fail_after_s"], st
    assert st["complete"] and st["won"] == 0 and st["rows"] == len(ref.outputs["pos"]), st
    assert res.complete and sink.complete()
    assert_same_output(ref.outputs["pos"], sink.read())


def test_a_stopped_sink_replica_is_still_declared_failed(tmp_path):
    """The negative control: the same short bounds, a replica really stopped (SIGSTOP)."""
    q, data = query(), inputs()
    ref = run_reference(q, data)
    data["s"] = inject_at(data["s"], seconds(6), StopReplica("pos", 1))
    sink = held_sink(str(tmp_path / "pos"), held=None, hold_s=0.0)
    with deploy(q, servers=SERVERS, k=2, app_replicas=2, sinks={"pos": sink}, **DETECT) as dep:
        res = dep.run(data, pace=4.0, timeout=180)
        deadline = time.time() + 60
        while not events(dep, "declared_failed", "pos#1"):
            assert time.time() < deadline, f"pos#1 was stopped and never declared failed: {dep.events[-10:]}"
            time.sleep(0.05)
        assert not dep.topology.is_running("pos#1")
        assert not [e for e in events(dep, "declared_failed") if e["actor"] != "pos#1"]
    assert res.complete and sink.complete()
    assert_same_output(ref.outputs["pos"], sink.read())

"""Garbage collection and detached deployments with entry partitions and partitioned applications
on Ray (issue #41): ``parallelism={"entry": p, app: p}`` with ``gc=`` collects per partition
replica (an entry or application partition is an operator of its own for ``kmin``: its last live
replica is never collected), and a detached deployment with them feeds, outlives its killed driver
and writes its ParquetSink completely, per partition. Each output equals the reference run's,
through a replica kill."""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray

import replistream as rs
from replistream import FileSource, ParquetSink, seconds
from replistream.engines.ray import GCConfig, deploy
from replistream.engines.ray.host import list_deployments
from replistream.sinks import MARKER
from replistream.sources import Call
from replistream.testing import assert_same_output, run_reference
from replistream.workloads import fig1_inputs, fig1_query

pytestmark = pytest.mark.usefixtures("ray_session")

SCRIPT = Path(__file__).parent / "scripts" / "detached_partitions_driver.py"
spec = importlib.util.spec_from_file_location("detached_partitions_driver", SCRIPT)
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)

_spec = importlib.util.spec_from_file_location("test_detached", Path(__file__).parent / "test_detached.py")
detached = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(detached)
write_inputs, wait_for_line = detached.write_inputs, detached.wait_for_line  # (shared with test_detached.py)

GROUPS = ("entry.0", "entry.1", "alerts.0", "alerts.1")


def endpoints(sid: str) -> list[str]:
    """The two replica labels of a stream replica id ``src->dst:port``."""
    src, _, rest = sid.partition("->")
    return [src, rest.rpartition(":")[0]]


@pytest.mark.slow
def test_gc_collects_per_entry_and_application_partition_replica_through_a_kill():
    """Fig. 1 with entry points in 2 partitions, the application ``alerts`` in 2 and the Join in 2,
    k=2, kmin=1, theta 0.05 of the first cost. ``entry.1#0`` is killed before the feed, so
    ``entry.1#1`` is its partition's last live replica: garbage collection discards around it
    (stream replicas of entry partition replicas among them) but never collects it, and
    every entry and application partition keeps a live replica at every decision. Mid-run, once
    collection has run, an application partition replica (``alerts.0#0``) is killed too: its
    partition's peer masks it. The alerts equal the reference run's exactly."""
    q = fig1_query(n_servers=3, window_s=2.0, punctuate_s=0.5)
    data = {k: list(v) for k, v in fig1_inputs(n_servers=3, duration_s=20, period_s=0.25, seed=4, chunk=2).items()}
    killed = []

    def kill_after_gc(d):  # the feeder waits here until collection has run, then the kill
        deadline, tick = time.monotonic() + 120, threading.Event()
        while not any(e["kind"] == "gc" for e in d.gc_events()):
            assert time.monotonic() < deadline, "no garbage collection within 120 s"
            tick.wait(0.05)
        d.kill_replica("alerts.0", 0)
        killed.append("alerts.0#0")

    data["load_0"].insert(len(data["load_0"]) // 2, Call(kill_after_gc))
    cfg = GCConfig(utility_period_s=0.5, gc_period_s=0.5, theta_fraction=0.05, max_steps=None, kmin=1)
    ref = run_reference(q, data)
    with deploy(q, servers=4, k=2, network="geo", gc=cfg, parallelism={"entry": 2, "alerts": 2, "correlate": 2},
                bits=4) as dep:
        dep.kill_replica("entry.1", 0)
        res = dep.run(data, timeout=180, pace=2.0)
        assert res.complete, res.punctuation
        assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
        assert killed == ["alerts.0#0"]
        gcs = [e for e in dep.gc_events() if e["kind"] == "gc"]
        assert gcs, dep.gc_events()
        for e in gcs:
            assert e["cost_after"] < e["cost_before"]
            assert all(e["live_after"][g] >= 1 for g in GROUPS), e["live_after"]
            assert e["live_after"]["entry.1"] == 1, e["live_after"]  # its last replica stays
            assert "entry.1#1" not in e["replicas"], e
        # collection reached the entry partitions' stream replicas
        touched = {r for e in gcs for s in e["streams"] for r in endpoints(s) if r.startswith("entry.")}
        assert touched, gcs
        states = {r.label: r.state for r in dep.topology.replicas()}
        assert states["entry.1#0"] == "failed" and states["entry.1#1"] == "live", states
        assert states["alerts.0#0"] == "failed" and states["alerts.0#1"] == "live", states
        for g in GROUPS:  # every partition still has a live, running replica
            assert any(dep.alive.get(r.label) for r in dep.topology.replicas(g, state="live")), g


@pytest.mark.slow
def test_a_detached_deployment_with_entry_and_application_partitions_outlives_its_driver(tmp_path):
    """A driver deploys (detached) with ``parallelism={"entry": 2, "out": 2}`` and a ParquetSink, feeds
    paced and is killed with SIGKILL; another driver attaches, kills an entry partition replica
    (``entry.1#0``, masked by its partition's peer), waits: every partition's marker is there, and
    the files equal the reference run's output exactly."""
    in_dir = write_inputs(tmp_path / "in")
    out_dir = str(tmp_path / "out")
    ref = run_reference(driver.build(in_dir), {"s": FileSource(in_dir, time="t")})
    port = ray.get_runtime_context().gcs_address.rpartition(":")[2]  # the session's Ray listens on loopback only
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "parts", in_dir, out_dir], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_line(proc, "fed", 180)
        os.kill(proc.pid, signal.SIGKILL)  # the driver dies mid-run (the replay takes 8 s of wall time)
        proc.wait(30)
        assert "parts" in list_deployments()
        dep = rs.attach("parts")
        assert dep.detached and dep.partitions("entry") == 2
        assert not dep.status()["complete"]  # killed before the end of the stream
        dep.kill_replica("entry.1", 0)
        assert dep.wait(120)
        status = dep.status()
        assert status["complete"] and status["applications"]["out"]["delivered"] == len(ref.outputs["out"])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()
        try:
            rs.attach("parts").stop()
        except LookupError:
            pass
    assert "parts" not in list_deployments()
    assert sorted(n for n in os.listdir(out_dir) if n.startswith(MARKER)) == [MARKER, f"{MARKER}-p0000",
                                                                             f"{MARKER}-p0001"]
    sink = ParquetSink(out_dir)
    assert sink.complete()
    assert_same_output(ref.outputs["out"], sink.read())


@pytest.mark.slow
@pytest.mark.parametrize("chunk_ms", [None, 20.0])
def test_losing_the_host_of_a_detached_deployment_with_entry_partitions_mid_feed(tmp_path, chunk_ms):
    """The serving host SIGKILLed while it feeds entry partitions from Parquet files (chunks read by
    Ray tasks, sent by reference); the host standing by restores the deployment. Fed paced with
    ``chunk_ms=None`` (chunks cut by ``chunk_size`` alone) the restored feeder cuts and routes the
    files again as the lost host did; fed paced with ``chunk_ms`` (pieces cut by wall time) it
    cuts them anew, and sends the records no partition took, known from the ranges each
    partition remembers. Either way the Parquet output equals the reference run exactly. (Killed
    at a chosen point, between the partitions: tests/ray/test_entry_partitions_resume_ray.py.)"""
    from replistream.engines.ray.standby import pair, serving_host
    from replistream.engines.ray.host import NAMESPACE
    from replistream.engines.ray.lifecycle import Persister, get_value

    name = f"parts-host-lost-{0 if chunk_ms is None else 1}"
    in_dir = write_inputs(tmp_path / "in")
    q = driver.build(in_dir)
    ref = run_reference(q, {"s": FileSource(in_dir, time="t")})
    dep = rs.deploy(q, servers=3, k=2, name=name, detached=True, fail_after_s=3.0,
                    parallelism=driver.PARALLELISM, sinks={"out": ParquetSink(str(tmp_path / "out"), every=seconds(2))})
    try:
        deadline, tick = time.monotonic() + 60, threading.Event()
        while True:  # the second host stands by before the loss
            try:
                if ray.get(ray.get_actor(pair(name)[1], namespace=NAMESPACE).process.remote(),
                           timeout=30)["role"] == "standby":
                    break
            except ValueError:
                pass  # not started yet
            assert time.monotonic() < deadline, "no host stands by"
            tick.wait(0.1)
        dep.feed({"s": FileSource(in_dir, time="t")}, pace=2.0, chunk_ms=chunk_ms, chunk_size=500)
        while not (get_value(Persister.key(name, "state")) or {}).get("fed"):  # kept: the next host resumes
            assert time.monotonic() < deadline + 60, "the feed was never kept"
            tick.wait(0.1)
        assert not dep.status()["complete"]
        os.kill(ray.get(serving_host(name, NAMESPACE).process.remote(), timeout=30)["pid"], signal.SIGKILL)
        assert dep.wait(180)
        (restored,) = [e for e in dep.events if e.get("event") == "control_restored"]
    finally:
        dep.stop()
    assert len(restored["resumed"]["parts"]) == 2, restored
    assert_same_output(ref.outputs["out"], ParquetSink(str(tmp_path / "out")).read())
    assert name not in list_deployments()

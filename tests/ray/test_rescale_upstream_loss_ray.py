"""A rescale (``dep.rescale``, replistream/engines/ray/rescale.py) whose operator's upstream replica
dies while the new partitions connect to it (``_start_partitions``): the dead replica is marked
failed, as a hand-over marks one (``handover._connect``), and the rescale goes on with the surviving
upstream replica; the output equals the reference run as a multiset. With every upstream replica
dead, the rescale raises RunFailed naming them (never a bare ActorDiedError).

The death is placed by a seam, not a sleep: the control plane's ``set_clock`` (called for each new
replica after its actor started, before any upstream replica is asked to connect to it) is wrapped
to kill the upstream replicas (unannounced, as a crash) and wait until Ray reports them dead (a ping sent after ``ray.kill`` may still be answered: it is sent
again until it fails)."""
from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest
import ray

from replistream import deploy
from replistream.errors import RunFailed
from replistream.testing import assert_same_output, run_reference

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]

_spec = importlib.util.spec_from_file_location("rescale_faults", Path(__file__).parent / "test_rescale_faults_ray.py")
faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(faults)


def kill_upstream_at_first_connect(dep, victims: list[str]) -> dict:
    """Wrap the deployment's ``set_clock`` so that, the first time it is given a new partition's
    replica, ``victims`` are killed (no restart, nothing told to the control plane) and their death
    is visible before the rescale asks them to connect. Returns ``{"killed": [...]}`` once done."""
    plane = dep._backend.plane
    original = plane.set_clock
    done: dict = {}

    def set_clock(handles, *args, **kwargs):
        if not done and plane.rescaling.is_set():
            for label in victims:
                ray.kill(plane.topology.handle(label), no_restart=True)
            for label in victims:  # ray.kill is asynchronous: a ping sent at once may still be answered
                tick, deadline = threading.Event(), time.monotonic() + 60
                while True:
                    try:
                        ray.get(plane.topology.handle(label).ping.remote(), timeout=60)
                    except ray.exceptions.RayActorError:
                        break
                    if time.monotonic() > deadline:
                        raise AssertionError(f"{label} still answers 60 s after ray.kill")
                    tick.wait(0.02)
            done["killed"] = list(victims)
        return original(handles, *args, **kwargs)

    plane.set_clock = set_clock
    return done


def test_an_upstream_replica_lost_while_new_partitions_connect_is_marked_failed_and_the_rescale_exact():
    """1 -> 2 fluid, k=2: ``keep#0`` (upstream of ``per_k``) dies just before the new partition's
    replicas are connected to it. The rescale returns its record (64 steps), ``keep#0`` is counted
    failed (a ``dead`` event), every step is installed at both new replicas,
    and the output equals the reference run's."""
    q, data = faults.query("rescale_upstream_loss"), faults.inputs(seed=31)
    ref = run_reference(q, data)
    first = faults.Gate()
    with deploy(q, servers=faults.SERVERS, k=2, parallelism={"per_k": 1}, bits=6) as dep:
        killed = kill_upstream_at_first_connect(dep, ["keep#0"])
        dep.feed(faults.gated_at(data, {30: first}), pace=None)
        assert first.reached.wait(120)
        t, out = faults.start_rescale(dep, 2, "fluid", gap_ms=10.0, timeout=120.0)
        first.opened.set()
        t.join(timeout=300)
        assert not t.is_alive(), "the rescale did not return"
        if "error" in out:
            pytest.fail(f"the rescale failed although keep#1 survived: {type(out['error']).__name__}: {out['error']}")
        assert killed.get("killed") == ["keep#0"], (killed, out)
        rec = out["rec"]
        assert (rec["steps"], rec["bins_moved"]) == (32, 32), rec
        assert dep.partitions("per_k") == 2
        assert not dep.topology.is_running("keep#0")
        assert dep.topology.replica("keep#0").state == "failed"
        dead = [e for e in dep.events if e.get("event") == "dead" and e.get("actor") == "keep#0"]
        assert dead, [e for e in dep.events if e.get("actor") == "keep#0"]
        assert all(s["installed"] == 32 for s in faults.status(dep, "per_k.1").values())
        dep.wait(timeout=300)
        res = dep.collect()
    assert res.complete, res.punctuation
    assert_same_output(ref.outputs["out"], res.outputs["out"])


def test_every_upstream_replica_lost_while_new_partitions_connect_fails_the_rescale_naming_them():
    """Both replicas of ``keep`` die just before the new partition's replicas are connected: no input
    can reach them, so the rescale raises RunFailed naming ``keep#0`` and ``keep#1`` (one line), not a
    bare ActorDiedError."""
    q, data = faults.query("rescale_upstream_gone"), faults.inputs(n=10_000, seed=32)
    first = faults.Gate()
    with deploy(q, servers=faults.SERVERS, k=2, parallelism={"per_k": 1}, bits=6) as dep:
        killed = kill_upstream_at_first_connect(dep, ["keep#0", "keep#1"])
        dep.feed(faults.gated_at(data, {10: first}), pace=None)
        assert first.reached.wait(120)
        t, out = faults.start_rescale(dep, 2, "fluid", gap_ms=10.0, timeout=60.0)
        first.opened.set()
        t.join(timeout=300)
        assert not t.is_alive(), "the rescale did not return"
        assert killed.get("killed") == ["keep#0", "keep#1"], (killed, out)
        assert "error" in out, f"the rescale reported success with every upstream replica lost: {out.get('rec')}"
        err = out["error"]
        assert isinstance(err, RunFailed), f"{type(err).__name__}: {err}"
        assert "keep#0" in str(err) and "keep#1" in str(err) and "\n" not in str(err), err
        with pytest.raises(RunFailed):
            dep.wait(timeout=120)

"""Issue #40 on Ray: a detached deployment's second host stands by and takes the deployment up the
moment the serving host's process is lost (replistream/engines/ray/standby.py): SIGKILLed, or
SIGSTOPped with its coordinator lost too (nobody else watches it then: the host standing by fences
it). The output equals the reference run, a client made before the loss goes on working, and a
lease generation is claimed by exactly one host."""
from __future__ import annotations

import importlib.util
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import ray

import replistream as rs
from replistream import FileSource, ParquetSink, seconds
from replistream.engines.ray.host import NAMESPACE, list_deployments
from replistream.engines.ray.standby import claim, holder, pair, serving_host
from replistream.testing import assert_same_output, run_reference

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("detached_driver", HERE / "scripts" / "detached_driver.py")
driver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(driver)
_spec = importlib.util.spec_from_file_location("test_detached", HERE / "test_detached.py")
detached = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(detached)


def _standing_by(name: str, timeout: float = 60) -> dict:
    """Wait until deployment ``name``'s second host stands by; its process."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            info = ray.get(ray.get_actor(pair(name)[1], namespace=NAMESPACE).process.remote(), timeout=30)
            if info["role"] == "standby":
                return info
        except ValueError:
            pass  # not started yet
        time.sleep(0.1)
    raise AssertionError(f"no host of {name!r} stood by within {timeout} s")


def _run(tmp_path, name: str, lose, fail_after_s: float = 4.0):
    in_dir = detached.write_inputs(tmp_path / "in", files=3, rows=1500)
    out_dir = str(tmp_path / "out")
    q = driver.build(in_dir)
    ref = run_reference(q, {"s": FileSource(in_dir, time="t")})
    dep = rs.deploy(q, servers=3, k=2, name=name, detached=True, fail_after_s=fail_after_s,
                    sinks={"out": ParquetSink(out_dir, every=seconds(2))})
    try:
        second = _standing_by(name)
        dep.feed({"s": FileSource(in_dir, time="t")}, pace=3.0)
        time.sleep(1.5)
        lost = lose(dep)
        assert dep.wait(180)  # (this client was made before the loss: its calls go to the host serving now)
        events, status = dep.events, dep.status()
        again = rs.attach(name).status()  # a client made after the loss finds the serving host
    finally:
        dep.stop()
    assert status["complete"] and again["complete"], (status, again)
    assert_same_output(ref.outputs["out"], ParquetSink(out_dir).read())
    named = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a.get("namespace") == NAMESPACE}
    assert not set(pair(name)) & named and name not in list_deployments()  # both hosts stopped
    return events, second, lost


def test_the_host_standing_by_takes_over_a_killed_host(tmp_path):
    def kill(dep):
        info = ray.get(serving_host("sb-kill", NAMESPACE).process.remote(), timeout=30)
        os.kill(info["pid"], signal.SIGKILL)
        return info

    events, second, lost = _run(tmp_path, "sb-kill", kill)
    assert lost["actor"] == "sb-kill"
    serves = [e for e in events if e.get("event") == "host_serves"]
    restored = [e for e in events if e.get("event") == "control_restored"]
    assert [e["host"] for e in serves] == ["sb-kill~2"] and len(restored) == 1, (serves, restored)
    assert serves[0]["generation"] == 2


def test_a_stopped_host_whose_coordinator_is_lost_too_is_fenced_by_the_host_standing_by(tmp_path):
    def stop_both(dep):
        info = ray.get(serving_host("sb-stop", NAMESPACE).process.remote(), timeout=30)
        coordinator = ray.get(dep.coordinator.ping.remote(), timeout=30)["pid"]
        os.kill(info["pid"], signal.SIGSTOP)  # nobody but the host standing by watches it now
        os.kill(coordinator, signal.SIGKILL)
        return info

    events, second, lost = _run(tmp_path, "sb-stop", stop_both, fail_after_s=3.0)
    fenced = [e for e in events if e.get("event") == "host_fenced"]
    assert [e["pid"] for e in fenced] == [lost["pid"]], fenced
    assert [e["host"] for e in events if e.get("event") == "host_serves"] == ["sb-stop~2"]
    assert any(e.get("event") == "coordinator_replaced" for e in events)


def test_a_lease_generation_is_claimed_once():
    name = f"lease-{uuid.uuid4().hex[:8]}"
    from replistream.engines.ray.lifecycle import forget

    try:
        assert holder(name) is None
        assert claim(name, 1, name) and not claim(name, 1, name + "~2")
        assert claim(name, 2, name + "~2")
        lease = holder(name)
        assert (lease["gen"], lease["actor"], lease["pid"]) == (2, name + "~2", os.getpid())
    finally:
        forget(name)
    assert holder(name) is None

"""Issue #40 on Ray: a detached deployment's second host stands by and takes the deployment up the
moment the serving host's process is lost (replistream/engines/ray/standby.py): SIGKILLed, then
(the roles swapped) SIGSTOPped with its coordinator lost too (nobody else watches it then: the host
standing by fences it). The output equals the reference run, a client made before the losses goes
on working, and a lease generation is claimed by exactly one host."""
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


def _standing_by(host: str, timeout: float = 60) -> dict:
    """Wait until host actor ``host`` stands by; its process."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            info = ray.get(ray.get_actor(host, namespace=NAMESPACE).process.remote(), timeout=30)
            if info["role"] == "standby":
                return info
        except ValueError:
            pass  # not started yet
        time.sleep(0.1)
    raise AssertionError(f"host {host!r} did not stand by within {timeout} s")


def test_the_host_standing_by_takes_over_a_killed_host_then_a_stopped_one_whose_coordinator_is_lost(tmp_path):
    """The serving host SIGKILLed: the one standing by serves (generation 2) and Ray's restart of the
    lost one stands by; then that serving host SIGSTOPped with the coordinator SIGKILLed at once
    (nobody but the host standing by watches it then): fenced by it, which serves (generation 3)."""
    name = "sb-twice"
    first, second = pair(name)
    in_dir = detached.write_inputs(tmp_path / "in", files=4, rows=1500)
    out_dir = str(tmp_path / "out")
    q = driver.build(in_dir)
    ref = run_reference(q, {"s": FileSource(in_dir, time="t")})
    dep = rs.deploy(q, servers=3, k=2, name=name, detached=True, fail_after_s=3.0,
                    sinks={"out": ParquetSink(out_dir, every=seconds(2))})
    stopped = None
    try:
        _standing_by(second)
        dep.feed({"s": FileSource(in_dir, time="t")}, pace=2.0)
        time.sleep(1.0)
        killed = ray.get(serving_host(name, NAMESPACE).process.remote(), timeout=30)
        assert killed["actor"] == first
        os.kill(killed["pid"], signal.SIGKILL)
        _standing_by(first)  # restarted by Ray, it found the lease taken: it stands by
        stopped = ray.get(serving_host(name, NAMESPACE).process.remote(), timeout=30)
        assert stopped["actor"] == second and stopped["role"] == "serving", stopped
        coordinator = ray.get(dep.coordinator.ping.remote(), timeout=30)["pid"]
        os.kill(stopped["pid"], signal.SIGSTOP)
        os.kill(coordinator, signal.SIGKILL)
        assert dep.wait(180)  # (this client was made before both losses: its calls go to the host serving now)
        events, status = dep.events, dep.status()
        again = rs.attach(name).status()  # a client made after the losses finds the serving host
    finally:
        dep.stop()
        if stopped is not None:
            try:
                os.kill(stopped["pid"], signal.SIGKILL)  # (fenced already; in case it was not)
            except ProcessLookupError:
                pass
    assert status["complete"] and again["complete"] and again["host"] == first, (status, again)
    assert_same_output(ref.outputs["out"], ParquetSink(out_dir).read())
    serves = [(e["host"], e["generation"]) for e in events if e.get("event") == "host_serves"]
    assert serves == [(second, 2), (first, 3)], serves
    assert sum(e.get("event") == "control_restored" for e in events) == 2
    fenced = [e for e in events if e.get("event") == "host_fenced"]
    assert [e["pid"] for e in fenced] == [stopped["pid"]], fenced
    assert any(e.get("event") == "coordinator_replaced" for e in events)
    named = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a.get("namespace") == NAMESPACE}
    assert not {first, second} & named and name not in list_deployments()  # both hosts stopped


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

"""Issue #29 on Ray: the coordinator's loss does not end the run. It keeps its state (plan, actors,
reports log) in Ray's key-value store; the deployment puts a warm standby in its place when it dies
(killed, crashed) or stops answering (fenced first), every replica re-sends its reports to the new
one (each logged once, by id), and the output stays exact (docs/reliability.md)."""
from __future__ import annotations

import os
import signal
import time

import pytest
import ray

from replistream import deploy
from replistream.engines.ray.coordinator import KV_NAMESPACE, CoordinatorActor
from replistream.sources import Call, inject_at
from replistream.testing import run_reference

from test_slowness import SERVERS, exact, inputs, query  # tests/ray is on sys.path (rootdir import mode)

pytestmark = pytest.mark.usefixtures("ray_session")


def replaced(dep):
    return [e for e in dep.events if e.get("event") == "coordinator_replaced"]


def kill_coordinator(how):
    def act(dep):
        if how == "ray.kill":
            ray.kill(dep.coordinator)  # no restart
        elif how == "SIGKILL":
            os.kill(dep._coordinator_pid, signal.SIGKILL)
        else:
            os.kill(dep._coordinator_pid, signal.SIGSTOP)
    return Call(act)


@pytest.mark.parametrize("how", ["ray.kill", pytest.param("SIGKILL", marks=pytest.mark.slow),  # quick subset: one (#31)
                                 pytest.param("SIGSTOP", marks=pytest.mark.slow)])
def test_the_coordinator_lost_mid_run_is_replaced_and_the_output_is_exact(how):
    q, data = query(), inputs(n=1500, span_s=16)
    ref = run_reference(q, data)
    s = inject_at(data["s"], 5_000_000, kill_coordinator(how))
    with deploy(q, servers=SERVERS, k=2, repair=True) as dep:
        first, plan = dep.coordinator, dep.ask_coordinator("plan")
        res = dep.run({"s": s}, pace=4.0, timeout=120)
        log = dep.metrics()["coordinator"]
        assert dep.coordinator is not first
        assert dep.ask_coordinator("plan") == plan  # the new coordinator holds the plan it was started with
    exact(ref, res)
    (ev,) = replaced(dep)
    assert ev["restored"] == {"events": 1, "plan": True, "dormant": []}  # the placement event and the plan came back
    assert ("no answer" in ev["reason"]) == (how == "SIGSTOP")
    kinds = [e["kind"] for e in log]
    assert kinds[0] == "placement" and "coordinator_restored" in kinds


def test_reports_sent_again_to_a_new_coordinator_are_logged_once():
    key = f"replistream/coordinator/test-{time.time_ns()}"
    a = CoordinatorActor.remote(0.0, key)
    ray.get(a.report.remote("channel_dropped", {"from": "x#0", "to": "y#0", "reason": "slow", "rid": "x#0/0"}), timeout=30)
    ray.get(a.report.remote("channel_dropped", {"from": "x#0", "to": "y#0", "reason": "slow", "rid": "x#0/0"}), timeout=30)
    assert len(ray.get(a.log.remote(), timeout=30)) == 1
    ray.kill(a)
    b = CoordinatorActor.remote(0.0, key)  # takes the lost one's state up
    assert ray.get(b.ping.remote(), timeout=30)["restored"] == {"events": 1, "plan": False, "dormant": []}
    ray.get(b.report.remote("channel_dropped", {"from": "x#0", "to": "y#0", "reason": "slow", "rid": "x#0/0"}), timeout=30)
    ray.get(b.report.remote("fatal", {"replica": "y#0", "rid": "y#0/0"}), timeout=30)
    assert [e["kind"] for e in ray.get(b.log.remote(), timeout=30)] == ["channel_dropped", "coordinator_restored", "fatal"]
    assert ray.get(b.forget.remote(), timeout=30) > 0
    c = CoordinatorActor.remote(0.0, key)  # forgotten: nothing to take up
    assert ray.get(c.ping.remote(), timeout=30)["restored"] is None
    for h in (b, c):
        ray.kill(h)
    from ray.experimental import internal_kv
    assert internal_kv._internal_kv_list(key, namespace=KV_NAMESPACE) == []


def test_a_dormant_checkpoint_survives_the_coordinator():
    """Issue #40: dormant checkpoints no longer live in one coordinator's memory only."""
    from replistream.engines.ray.coordinator import CoordinatorActor

    key = "replistream/coordinator/tests-dormant"
    c = CoordinatorActor.remote(0.0, key)
    ray.get(c.keep_dormant.remote("per_k", "per_k#0", 41, {"state": [1, 2, 3]}), timeout=60)
    ray.kill(c, no_restart=True)
    new = CoordinatorActor.remote(0.0, key)  # a standby taking the lost one's key
    try:
        assert ray.get(new.ping.remote(), timeout=60)["restored"]["dormant"] == ["per_k"]
        assert ray.get(new.dormant_checkpoint.remote("per_k"), timeout=60) == (41, "per_k#0", {"state": [1, 2, 3]})
    finally:
        ray.get(new.forget.remote(), timeout=60)
        ray.kill(new, no_restart=True)

"""Issue #29 point 5 on Ray: dormant replicas (Rhino, Del Monte 2017). An operator down to one live
replica (its peers failed, or garbage collection kept kmin=1) gets a dormant checkpoint: the replica
sends the coordinator a checkpoint every ``dormant_every_s`` at a punctuation, and its upstream
replicas keep their output since. When that last replica is lost too, a new one is revived from the
checkpoint and the kept output instead of the run ending; the output stays exact."""
from __future__ import annotations

import time

import pytest

from replistream import RunFailed, deploy, seconds
from replistream.engines.ray import GCConfig
from replistream.sources import Call, KillReplica, inject_at
from replistream.testing import assert_same_output, run_reference
from replistream.workloads import fig1_inputs, fig1_query

from test_slowness import SERVERS, exact, inputs, query  # tests/ray is on sys.path (rootdir import mode)

pytestmark = pytest.mark.usefixtures("ray_session")


def kill_last_after_dormant(*operators: str, timeout: float = 60.0, killed: list | None = None):
    """A sentinel: wait until the last live replica of one of ``operators`` (the first in that
    order) has a dormant checkpoint at the coordinator, then kill it (every replica of the
    operator is then lost); the operator goes to ``killed``."""
    def act(dep):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for op in operators:
                live = [r.label for r in dep.topology.replicas(op) if r.state == "live"]
                if len(live) == 1 and dep.ask_coordinator("dormant_checkpoint", op) is not None:
                    dep.kill(live[0], "the last live replica killed")
                    if killed is not None:
                        killed.append(op)
                    return
            time.sleep(0.05)
        raise AssertionError(f"none of {operators} got a dormant checkpoint within {timeout} s")
    return Call(act)


def test_the_last_replica_lost_is_revived_from_its_dormant_checkpoint():
    q, data = query(), inputs(n=3000, span_s=24)
    ref = run_reference(q, data)
    s = inject_at(data["s"], seconds(6), KillReplica("per_k", 0))  # per_k runs on one replica from here
    s = inject_at(s, seconds(14), kill_last_after_dormant("per_k"))  # ... and loses it too
    with deploy(q, servers=SERVERS, k=2, gc=GCConfig(gc=False, dormant_every_s=0.5)) as dep:
        res = dep.run({"s": s}, pace=4.0, timeout=180)
        revived = [e for e in dep.events if e.get("event") == "revived_from_dormant"]
        on = [e for e in dep.events if e.get("event") == "dormant_on"]
    exact(ref, res)
    assert [e["operator"] for e in on][:1] == ["per_k"] and on[0]["replica"] == "per_k#1"
    (ev,) = revived
    assert ev["operator"] == "per_k" and ev["handover"]["per_k#2"]["dormant"]["from"] == "per_k#1"


def test_without_dormant_checkpoints_the_loss_of_every_replica_ends_the_run():
    """The negative control: the same faults with dormant_every_s=None end the run, naming what."""
    q, data = query(), inputs(n=3000, span_s=24)
    s = inject_at(data["s"], seconds(6), KillReplica("per_k", 0))
    s = inject_at(s, seconds(14), KillReplica("per_k", 1))
    with deploy(q, servers=SERVERS, k=2, gc=GCConfig(gc=False, dormant_every_s=None)) as dep:
        with pytest.raises(RunFailed, match="every replica of 'per_k' is lost") as e:
            dep.run({"s": s}, pace=4.0, timeout=180)
    assert e.value.operator == "per_k"


@pytest.mark.slow
def test_gc_down_to_kmin_1_then_the_last_replica_killed():
    """Algorithm 6 takes operators down to one replica (kmin=1); the last replica of one of them
    (the join if collection reached it) is then killed: it is revived from its dormant checkpoint
    and the alerts equal the ideal run's."""
    q = fig1_query(n_servers=3, window_s=2.0, punctuate_s=0.5)
    data = fig1_inputs(n_servers=3, duration_s=24, period_s=0.25, seed=4, chunk=2)
    ref = run_reference(q, data)
    first = sorted(data)[0]
    killed: list = []
    data[first] = inject_at(data[first], seconds(16), kill_last_after_dormant("correlate", *q.operators, timeout=90,
                                                                               killed=killed))
    cfg = GCConfig(utility_period_s=0.5, gc_period_s=0.5, theta_fraction=0.0, max_steps=None, kmin=1,
                   dormant_every_s=0.5)
    with deploy(q, servers=4, k=2, network="geo", gc=cfg) as dep:
        res = dep.run(data, pace=2.0, timeout=240)
        revived = [e for e in dep.events if e.get("event") == "revived_from_dormant"]
    assert res.complete
    assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
    assert len(killed) == 1 and [e["operator"] for e in revived] == killed

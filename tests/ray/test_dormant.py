"""Issue #29 point 5 on Ray: dormant replicas (Rhino, Del Monte 2017). An operator down to one live
replica (its peers failed, or garbage collection kept kmin=1) gets a dormant checkpoint: the replica
sends the coordinator a checkpoint every ``dormant_every_s`` at a punctuation, and its upstream
replicas keep their output since. When that last replica is lost too, a new one is revived from the
checkpoint and the kept output instead of the run ending; the output stays exact."""
from __future__ import annotations

import threading
import time

import pytest

from replistream import RunFailed, deploy, seconds
from replistream.engines.ray import GCConfig
from replistream.sources import Call, KillReplica, inject_at
from replistream.testing import assert_same_output, run_reference
from replistream.workloads import fig1_inputs, fig1_query

from test_slowness import SERVERS, exact, inputs, query  # tests/ray is on sys.path (rootdir import mode)

pytestmark = pytest.mark.usefixtures("ray_session")


def kill_last_after_dormant(*operators: str, timeout: float = 60.0, killed: list | None = None,
                            errors: list | None = None):
    """A sentinel: from a thread of its own (the feed goes on: a dormant checkpoint is taken at a
    punctuation, so a blocked feed would never bring one), wait until the last live replica of one
    of ``operators`` (the first in that order) has a dormant checkpoint at the coordinator, then
    kill it (every replica of the operator is then lost); the operator goes to ``killed``, a
    timeout to ``errors``."""
    def wait_and_kill(dep):
        deadline = time.time() + timeout
        while time.time() < deadline and not dep.delivered.complete():
            for op in operators:
                live = [r.label for r in dep.topology.replicas(op) if r.state == "live"]
                if len(live) == 1 and dep.ask_coordinator("dormant_checkpoint", op) is not None:
                    dep.kill(live[0], "the last live replica killed")
                    if killed is not None:
                        killed.append(op)
                    return
            time.sleep(0.05)
        if errors is not None:
            errors.append(f"none of {operators} got a dormant checkpoint in time")

    return Call(lambda dep: threading.Thread(target=wait_and_kill, args=(dep,), daemon=True).start())


def test_the_last_replica_lost_is_revived_from_its_dormant_checkpoint():
    q, data = query(), inputs(n=3000, span_s=24)
    ref = run_reference(q, data)
    s = inject_at(data["s"], seconds(6), KillReplica("per_k", 0))  # per_k runs on one replica from here
    killed, errors = [], []
    s = inject_at(s, seconds(14), kill_last_after_dormant("per_k", killed=killed, errors=errors))  # ... and that one
    with deploy(q, servers=SERVERS, k=2, gc=GCConfig(gc=False, dormant_every_s=0.5)) as dep:
        res = dep.run({"s": s}, pace=4.0, timeout=180)
        revived = [e for e in dep.events if e.get("event") == "revived_from_dormant"]
        on = [e for e in dep.events if e.get("event") == "dormant_on"]
    assert killed == ["per_k"] and errors == []
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
def test_collected_down_to_one_replica_then_the_last_replica_killed():
    """The join is collected down to one replica (the discard Algorithm 6 applies, at a known
    time rather than at the collector's measured moment, which varies with the machine's load),
    then its last replica is killed: it is revived from its dormant checkpoint and the alerts equal
    the ideal run's."""
    q = fig1_query(n_servers=3, window_s=2.0, punctuate_s=0.5)
    data = fig1_inputs(n_servers=3, duration_s=24, period_s=0.25, seed=4, chunk=2)
    ref = run_reference(q, data)
    first = sorted(data)[0]
    killed, errors = [], []
    discard = Call(lambda d: d.control_loop().handover.discard("correlate#0", "collected: kmin=1 keeps one replica"))
    data[first] = inject_at(inject_at(data[first], seconds(6), discard), seconds(12),
                            kill_last_after_dormant("correlate", timeout=90, killed=killed, errors=errors))
    cfg = GCConfig(gc=False, kmin=1, dormant_every_s=0.5)
    with deploy(q, servers=4, k=2, network="geo", gc=cfg) as dep:
        res = dep.run(data, pace=2.0, timeout=240)
        revived = [e for e in dep.events if e.get("event") == "revived_from_dormant"]
    assert errors == [] and killed == ["correlate"]
    assert res.complete
    assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
    assert [e["operator"] for e in revived] == ["correlate"]

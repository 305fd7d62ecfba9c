"""Dormant checkpoints per partition on Ray (issue #41 point 5; Rhino's dormant replica, Del Monte
2017): with ``parallelism=`` and ``gc=``, a partition ``op.P`` down to one live replica gets a
dormant checkpoint of its own, kept by the coordinator under ``"op.P"`` (each partition holds other
keys); when that last replica is lost too, a new replica of the same partition is revived from that
partition's checkpoint and the upstream output kept since, and the output equals the reference run
exactly."""
from __future__ import annotations

import threading
import time

import pytest

from replistream import deploy, seconds
from replistream.engines.ray import GCConfig
from replistream.sources import Call, KillReplica, inject_at
from replistream.testing import run_reference

from test_slowness import SERVERS, exact, inputs, query  # tests/ray is on sys.path (rootdir import mode)

pytestmark = pytest.mark.usefixtures("ray_session")


def kill_last_after_checkpoints(victim: str, need: tuple, killed: list, errors: list, timeout: float = 90.0):
    """A sentinel, from a thread of its own (the feed goes on: a dormant checkpoint is taken at a
    punctuation): once every group in ``need`` has a dormant checkpoint at the coordinator (looked
    up by the group's name, ``"op.P"``), kill the last live replica of partition ``victim``; what
    it killed goes to ``killed``, a timeout to ``errors``."""
    def wait_and_kill(dep):
        deadline = time.time() + timeout
        while time.time() < deadline and not dep.delivered.complete():
            live = [r.label for r in dep.topology.replicas(victim) if r.state == "live"]
            if len(live) == 1 and all(dep.ask_coordinator("dormant_checkpoint", g) is not None for g in need):
                killed.append((live[0], {g: dep.ask_coordinator("dormant_checkpoint", g)[1] for g in need}))
                dep.kill(live[0], "the last live replica of its partition killed")
                return
            time.sleep(0.05)
        errors.append(f"not every one of {need} got a dormant checkpoint in time")

    return Call(lambda dep: threading.Thread(target=wait_and_kill, args=(dep,), daemon=True).start())


@pytest.mark.slow
def test_a_partition_loses_every_replica_and_is_revived_from_its_own_dormant_checkpoint():
    """``per_k`` runs as 2 key partitions x 2 replicas; one replica of each partition is killed, so
    both partitions run on one replica and each sends dormant checkpoints of its own (the same
    operator, other keys); then partition 1's last replica is killed too. It is revived as
    ``per_k.1#2`` from partition 1's checkpoint (a checkpoint of partition 0 would hold the wrong
    keys: the output would differ), partition 0 is left alone, and the output is exact."""
    q, data = query(), inputs(n=3000, span_s=24)
    ref = run_reference(q, data)
    s = inject_at(data["s"], seconds(5), KillReplica("per_k.0", 0))
    s = inject_at(s, seconds(6), KillReplica("per_k.1", 0))
    killed, errors = [], []
    s = inject_at(s, seconds(12), kill_last_after_checkpoints("per_k.1", ("per_k.0", "per_k.1"), killed, errors))
    cfg = GCConfig(gc=False, dormant_every_s=0.5)
    with deploy(q, servers=SERVERS, k=2, gc=cfg, parallelism={"per_k": 2}, bits=4) as dep:
        res = dep.run({"s": s}, pace=4.0, timeout=240)
        on = [(e["operator"], e["replica"]) for e in dep.events if e.get("event") == "dormant_on"]
        revived = [e for e in dep.events if e.get("event") == "revived_from_dormant"]
        whole = dep.ask_coordinator("dormant_checkpoint", "per_k")
        kept = {g: dep.ask_coordinator("dormant_checkpoint", g) for g in ("per_k.0", "per_k.1")}
        live = sorted(r.label for r in dep.topology.replicas("per_k", state="live"))
    assert errors == [] and killed, errors
    # each partition's checkpoint came from its own last replica, under its own name
    assert killed[0] == ("per_k.1#1", {"per_k.0": "per_k.0#1", "per_k.1": "per_k.1#1"}), killed
    assert ("per_k.0", "per_k.0#1") in on and ("per_k.1", "per_k.1#1") in on and whole is None, (on, whole)
    (ev,) = revived
    assert ev["operator"] == "per_k.1" and ev["new"] == "per_k.1#2", ev
    assert ev["handover"]["per_k.1#2"]["dormant"]["from"] == "per_k.1#1", ev["handover"]
    assert live == ["per_k.0#1", "per_k.1#2"], live
    assert kept["per_k.0"][1] == "per_k.0#1" and kept["per_k.1"][1] in ("per_k.1#1", "per_k.1#2"), kept
    exact(ref, res)

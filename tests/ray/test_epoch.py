"""Every packet and report carries its deployment's epoch (issue #40, point 6): a packet from
another deployment (an old sender of a pooled actor's previous life) is rejected with its sender
named and never processed, so a channel number of another deployment can no longer reach a
duplicate filter that lacks it (the chaos campaign's IndexError in ``_guard``); the coordinator
does not log another deployment's reports."""
from __future__ import annotations

import pytest
import ray

from replistream import Query
from replistream.engines.ray.actors import ReplicaActor, SinkActor
from replistream.engines.ray.channels import NO_ACK
from replistream.engines.ray.coordinator import CoordinatorActor

pytestmark = pytest.mark.usefixtures("ray_session")


def _query():
    q = Query("epoch")
    q.source("s", {"x": "i8"}).filter(lambda b: b["x"] > 0, name="f").sink("out")
    return q.build()


def test_a_packet_of_another_deployment_is_rejected_with_its_sender_named():
    q = _query()
    batch = q.schema_of("s").from_columns({"ts": [5], "x": [1]}, ids=[1])
    rep = ReplicaActor.remote(q, "f", 0, "a", [1], None, 0.0, {"epoch": "new"})
    app = SinkActor.remote(q, "out", "a", [1], None, 0.0, {"epoch": "new"})
    try:
        # channel 7 does not exist in this deployment: without the epoch check this raised IndexError
        assert ray.get(rep.push.remote(0, 7, [batch], "old", "entry#3"), timeout=60) == NO_ACK
        assert ray.get(app.push.remote(0, 7, [batch], "old", "f#3"), timeout=60) == NO_ACK
        stale = ray.get(rep.__ray_call__.remote(lambda self: self.stale), timeout=60)
        assert stale[0]["sender"] == "entry#3" and stale[0]["epoch"] == "old" and stale[0]["channel"] == 7
        assert ray.get(rep.stats.remote(), timeout=60)["pushes"] == 0  # never processed
        ray.get(rep.push.remote(0, 0, [batch], "new", "entry#0"), timeout=60)
        assert ray.get(rep.stats.remote(), timeout=60)["pushes"] == 1  # its own deployment's packet is
    finally:
        ray.kill(rep)
        ray.kill(app)


def test_the_coordinator_does_not_log_another_deployments_reports():
    c = CoordinatorActor.remote(0.0, "replistream/coordinator/tests-epoch-new")
    try:
        ray.get(c.report.remote("channel_dropped", {"from": "f#0", "to": "out", "reason": "x", "epoch": "old"}))
        ray.get(c.report.remote("channel_dropped", {"from": "f#0", "to": "out", "reason": "y",
                                                    "epoch": "tests-epoch-new"}))
        assert [e["reason"] for e in ray.get(c.log.remote())] == ["y"]
    finally:
        ray.get(c.forget.remote())
        ray.kill(c)


def test_a_packet_taken_as_a_staged_transfer_completes_is_processed_not_rejected():
    """A packet that reaches a receiver as its staged transfer completes is processed through
    ``push`` again; it carries the deployment's epoch there (it was checked on arrival). Without it
    the receiver rejected its own deployment's packet as stale: a tuple lost (caught by
    tests/ray/test_transfer_runtime.py's moves, about one run in six)."""
    cls = ReplicaActor.__ray_metadata__.modified_class  # the actor's class, run in this process
    q = _query()
    rep = cls(q, "f", 0, "a", [1], None, 0.0, {"epoch": "e"})
    try:
        batch = q.schema_of("s").from_columns({"ts": [5], "x": [1]}, ids=[1])
        rep.staged = None  # the transfer completed just before the packet is taken
        rep._push_staged(0, 0, [batch])
        assert rep.stale == [] and rep.pushes == 1
    finally:
        rep.stop_sending()

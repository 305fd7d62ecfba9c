"""The lock order of the process that holds a deployment (issue #40, point 5; docs/design.md,
"Lock order, per process"): the control loop's lock, then the feeder's, then the delivered
results', then the topology's, never the other way. The four locks of a running deployment are
replaced by recording ones; the run then goes through every path that takes them (the feeder,
polling, the failure monitor, a crash and its repair, the control loop's periods, a change to the
running query, collect and metrics), and no thread may ever take a lock while holding one after it.
The output still equals the reference."""
from __future__ import annotations

import threading

import pytest

from replistream import deploy
from replistream.engines.ray.control import GCConfig
from replistream.sources import Call, KillReplica, inject_at
from replistream.testing import assert_same_output, run_reference
from replistream.workloads import fig1_inputs, fig1_query

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]


class Recorder:
    """Per thread, the ranks of the recording locks it holds; every acquisition of a lock of a lower
    rank than one held (other than re-entering it) is a violation."""

    def __init__(self):
        self.local = threading.local()
        self.violations: list[tuple[str, str, str]] = []
        self.nested: set[tuple[str, str]] = set()  # (held, taken) pairs seen: the check saw nesting
        self.guard = threading.Lock()

    def held(self) -> list:
        if not hasattr(self.local, "held"):
            self.local.held = []
        return self.local.held


class OrderedLock:
    def __init__(self, inner, rank: int, name: str, rec: Recorder):
        self.inner, self.rank, self.name, self.rec = inner, rank, name, rec

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        held = self.rec.held()
        for other in held:
            if other is self:
                continue
            with self.rec.guard:
                self.rec.nested.add((other.name, self.name))
                if other.rank > self.rank:
                    self.rec.violations.append((threading.current_thread().name, other.name, self.name))
        ok = self.inner.acquire(blocking, timeout)
        if ok:
            held.append(self)
        return ok

    def release(self) -> None:
        held = self.rec.held()
        for i in range(len(held) - 1, -1, -1):
            if held[i] is self:
                del held[i]
                break
        self.inner.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def test_the_deployment_takes_its_locks_in_the_documented_order():
    rec = Recorder()
    q = fig1_query(n_servers=3, window_s=2.0, punctuate_s=0.5)
    data = {k: list(v) for k, v in fig1_inputs(n_servers=3, duration_s=12, period_s=0.25, seed=4, chunk=2).items()}
    plain = dict(data)

    def change(dep):
        dep.replace_function("hot", lambda b: b["cpu"] > 0.5)  # takes locks 1 then 2

    data["load_0"] = inject_at(data["load_0"], 3_000_000, KillReplica("loads", 0))
    data["ping_0"] = inject_at(data["ping_0"], 5_000_000, Call(change))
    cfg = GCConfig(utility_period_s=1, gc_period_s=2, theta_fraction=0.5)
    with deploy(q, servers=4, k=2, gc=cfg, repair=True, progress=False) as dep:
        for obj, rank, name in [(dep.manager, 1, "ReplicaManager.lock"), (dep.feeder, 2, "Feeder.lock"),
                                (dep.delivered, 3, "Delivered.lock"), (dep.topology, 4, "Topology.lock")]:
            obj.lock = OrderedLock(obj.lock, rank, name, rec)
        res = dep.run(data, pace=2.0, timeout=300)
        dep.metrics()
        repairs = list(dep.repairs)
        ref = run_reference(dep.query, plain)  # the query as changed: both functions, switched at the change's time
    assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
    assert any(r.get("repaired") for r in repairs), repairs
    assert not rec.violations, rec.violations
    # the check saw the nestings the order is about (it could fail): 1 -> 2 (the change), 3 -> 4 (poll)
    assert ("ReplicaManager.lock", "Feeder.lock") in rec.nested and ("Delivered.lock", "Topology.lock") in rec.nested

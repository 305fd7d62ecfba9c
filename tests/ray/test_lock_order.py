"""The lock order of every process of a deployment (issue #40, point 5; docs/design.md, "Lock order,
per process"). The suite runs with ``REPLISTREAM_LOCK_ORDER=1`` (tests/conftest.py), so every lock of
the control plane's process and of every actor records, per thread, the locks held when it is taken
(engines/ray/lockorder.py): taking a lock ranked before one held, or a second lock of one rank (two
outboxes' at once), is a violation. A run goes through every path that takes them (the feeder,
polling, the failure monitor, a crash and its repair, the control loop's periods, a staged move, a
change to the running query, collect and metrics); then the driver, the coordinator and every
entry, operator and application replica still running must have recorded no violation, and the
nestings the order is about must have been seen (the check could fail). The output still equals
the reference."""
from __future__ import annotations

import threading

import pytest
import ray

from replistream import deploy
from replistream.engines.ray import lockorder
from replistream.engines.ray.control import GCConfig
from replistream.sources import Call, KillReplica, inject_at
from replistream.testing import assert_same_output, run_reference
from replistream.workloads import fig1_inputs, fig1_query

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]


def test_every_process_of_a_deployment_takes_its_locks_in_the_documented_order():
    assert lockorder.enabled(), "the suite runs with REPLISTREAM_LOCK_ORDER=1 (tests/conftest.py)"
    q = fig1_query(n_servers=3, window_s=2.0, punctuate_s=0.5)
    data = {k: list(v) for k, v in fig1_inputs(n_servers=3, duration_s=12, period_s=0.25, seed=4, chunk=2).items()}
    plain = dict(data)

    def change(dep):
        dep.replace_function("hot", lambda b: b["cpu"] > 0.5)  # the control loop's lock, then the feeder's

    moved: list = []

    def move(dep):  # a staged transfer (staged_lock), in a thread: its steps need the feed to go on
        server = next(s for s in dep.servers if s not in {dep.actor_server[f"correlate#{i}"] for i in (0, 1)})

        def run():
            try:
                moved.append(dep.move_replica("correlate", 1, server, strategy="fluid", bits=3))
            except BaseException as e:  # raised below
                moved.append(e)
        t = threading.Thread(target=run, name="test-move")
        t.start()
        moved.append(t)

    data["load_0"] = inject_at(data["load_0"], 3_000_000, KillReplica("loads", 0))
    data["ping_0"] = inject_at(data["ping_0"], 5_000_000, Call(change))
    data["ping_1"] = inject_at(data["ping_1"], 7_000_000, Call(move))
    cfg = GCConfig(utility_period_s=1, gc_period_s=2, theta_fraction=0.5)
    with deploy(q, servers=5, k=2, gc=cfg, repair=True, progress=False) as dep:
        res = dep.run(data, pace=2.0, timeout=300)
        moved[0].join(300)
        assert len(moved) == 2 and isinstance(moved[1], dict), moved  # the move completed
        dep.metrics()
        repairs = list(dep.repairs)
        ref = run_reference(dep.query, plain)  # the query as changed: both functions, switched at the change's time
        running = [(label, h) for label, h in dep.handles.items() if dep.alive[label]]
        records = dict(zip([label for label, _ in running],
                           ray.get([h.lock_order.remote() for _, h in running], timeout=60)))
        records["coordinator"] = ray.get(dep.coordinator.lock_order.remote(), timeout=60)
    records["driver"] = lockorder.report()
    assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
    assert any(r.get("repaired") for r in repairs), repairs
    assert all(r["on"] for r in records.values()), {k: r["on"] for k, r in records.items()}
    assert not {k: r["violations"] for k, r in records.items() if r["violations"]}
    kinds = {k.split("#")[0]: set() for k in records}
    for k, r in records.items():
        kinds[k.split("#")[0]] |= {tuple(p) for p in r["nested"]}
    seen = set().union(*kinds.values())
    # the nestings the order is about were seen (so the check could have failed): the driver's control
    # action before the feeder, results before the topology; a replica's own lock before its outbox's;
    # an entry replica's before its outboxes'
    for pair in [("ReplicaManager.lock", "Feeder.lock"), ("Delivered.lock", "Topology.lock"),
                 ("ReplicaActor.lock", "Outbox.lock"), ("EntryActor.lock", "Outbox.lock")]:
        assert pair in seen, (pair, sorted(seen))

"""Staged state transfers on Ray (issue #8; Megaphone §3.3, docs/migration.md): move_replica with each
strategy while another replica fails, and a transfer whose sending peer dies restarting from another."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from replistream import Query, seconds
from replistream.operators.keyed import KeyedCount
from replistream.engines.ray import deploy
from replistream.testing import Call, assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")


def count_and_window_query() -> Query:
    q = Query("transfer")
    s = q.source("s", {"k": "i8", "v": "i8"}, punctuate_every=seconds(0.05))
    s.apply(KeyedCount(by="k", keep=("v",), bits=6), name="counts").sink("out")
    s.window(size=seconds(0.4), slide=seconds(0.2), by="k", aggs={"n": "count", "s": ("v", "sum")},
             name="agg").sink("sums")
    return q.build()


def chunks(n=4000, seed=0):
    rng = np.random.default_rng(seed)
    ts = np.arange(n, dtype=np.int64) * seconds(0.004)
    return [{"ts": ts[i:i + 100], "k": rng.integers(0, 300, 100), "v": rng.integers(0, 9, 100)}
            for i in range(0, n, 100)]


class Background:
    """Run a deployment call in a thread (so the feeder keeps feeding while state moves)."""

    def __init__(self):
        self.thread, self.result, self.error = None, None, None

    def start(self, fn):
        def run():
            try:
                self.result = fn()
            except Exception as e:  # re-raised by join()
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout=180):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the transfer did not finish"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["all-at-once", "batched", "fluid"])
def test_move_with_each_strategy_while_another_replica_dies(strategy):
    q = count_and_window_query()
    moves = {"counts": Background(), "agg": Background()}
    data = chunks()
    target = {}

    def start(dep):
        target["server"] = [s for s in dep.servers if s not in (dep.actor_server["counts#0"],
                                                                 dep.actor_server["counts#1"])][0]
        for op, bg in moves.items():
            bg.start(lambda op=op: dep.move_replica(op, 0, target["server"], strategy=strategy,
                                                    bins_per_step=4, bits=4))

    def kill_others_once_moving(dep):
        """Kill the other replicas once the state of counts#0 has started to move (coordinator progress)."""
        deadline = time.time() + 120
        while not any(t["operator"] == "counts" for t in dep.transfers()):
            assert time.time() < deadline, "the transfer never started"
            time.sleep(0.01)
        dep.kill_replica("counts", 1)
        dep.kill_replica("agg", 1)

    inputs = {"s": data[:10] + [Call(start)] + data[10:12] + [Call(kill_others_once_moving)] + data[12:]}
    ref = run_reference(q, inputs)
    with deploy(q, servers=4, k=2) as dep:
        res = dep.run(inputs, pace=4.0, timeout=180)
        events = {op: bg.join() for op, bg in moves.items()}
        assert res.complete
        for app in q.sinks:
            assert_same_output(ref.outputs[app], res.outputs[app])
        # nothing here is malformed or late in the input: a dead letter would be a stream replica
        # breaking its punctuation contract (e.g. a moved replica emitting below its punctuation)
        assert not res.dead_letter_summary()
        for op, ev in events.items():
            (new,) = ev["new_replicas"]
            assert new["server"] == target["server"] and ev["action"] == "replace-replica"
            h = ev["handover"][new["label"]]
            assert h["strategy"] == strategy and h["steps"] == {"all-at-once": 1, "batched": 4, "fluid": 16}[strategy]
            assert not dep.alive[f"{op}#0"] and dep.alive[new["label"]]
        assert {t["state"] for t in dep.transfers()} == {"complete"}


@pytest.mark.slow
def test_a_transfer_whose_peer_dies_restarts_from_another_live_peer():
    q = count_and_window_query()
    data = chunks()
    bg = Background()

    def start(dep):
        bg.start(lambda: dep.add_replica("counts", strategy="fluid", bits=4, pause_ms=0))

    def kill_peer_mid_transfer(dep):
        """Wait (on the coordinator's progress record) until a few steps are in, then kill their sender."""
        deadline = time.time() + 120
        while time.time() < deadline:
            tr = dep.transfers()
            if tr and tr[-1]["done"] >= 3:
                dep.kill(tr[-1]["peer"], "killed mid-transfer")
                return
            time.sleep(0.01)
        raise AssertionError("the transfer never got to step 3")

    inputs = {"s": data[:10] + [Call(start)] + data[10:12] + [Call(kill_peer_mid_transfer)] + data[12:]}
    ref = run_reference(q, inputs)
    with deploy(q, servers=4, k=2) as dep:
        res = dep.run(inputs, pace=4.0, timeout=180)
        ev = bg.join()
        assert res.complete
        for app in q.sinks:
            assert_same_output(ref.outputs[app], res.outputs[app])
        (tr,) = dep.transfers()
        assert tr["restarts"] == 1 and tr["state"] == "complete" and tr["done"] == 16, {k: tr[k] for k in ("restarts", "state", "done", "step_s", "started_s", "seconds")}
        first, last = tr["peers"][0], tr["peers"][-1]
        assert first != last and not dep.alive[first] and dep.alive[last]
        assert any(e.get("action") == "restart" for e in dep.gc_events())
        assert ev["handover"][ev["new_replicas"][0]["label"]]["restarts"] == 1


def test_a_transfer_whose_receiver_dies_is_reported_failed_and_the_run_stays_exact():
    """The new replica dies mid-transfer: dep.transfers() says failed with the reason (not "running"),
    add_replica raises, and the other replicas keep the output exact (#15)."""
    q = count_and_window_query()
    data = chunks()
    bg = Background()

    def start(dep):
        bg.start(lambda: dep.add_replica("counts", strategy="fluid", bits=4, pause_ms=0))

    def kill_receiver_mid_transfer(dep):
        deadline = time.time() + 120
        while time.time() < deadline:
            tr = dep.transfers()
            if tr and tr[-1]["done"] >= 2:
                dep.kill(tr[-1]["replica"], "receiver killed mid-transfer")
                return
            time.sleep(0.01)
        raise AssertionError("the transfer never got to step 2")

    inputs = {"s": data[:10] + [Call(start)] + data[10:12] + [Call(kill_receiver_mid_transfer)] + data[12:]}
    ref = run_reference(q, inputs)
    with deploy(q, servers=4, k=2) as dep:
        res = dep.run(inputs, pace=4.0, timeout=180)
        with pytest.raises(Exception):
            bg.join()
        for app in q.sinks:
            assert_same_output(ref.outputs[app], res.outputs[app])
        (tr,) = dep.transfers()
        assert tr["state"] == "failed" and "died" in tr["error"], tr
        assert any(e.get("action") == "failed" for e in dep.gc_events())

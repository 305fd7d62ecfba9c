"""A Join moved in steps on Ray without a replay from its entry points (issue #30, point 1; Megaphone
§3.3, docs/migration.md "Ray transfer"), and the transfer's pacing by the live path (point 2).

The new replica's upstream links are added without replay (``connect_for_transfer``): the sending
peer takes its first step only once its duplicate filters have passed the links' connect marks, and
the steps carry the rest (the argument is in ``replistream/engines/ray/transfer.py``). If the input
pauses before that gate opens, the receiver is subscribed once more with replay."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import ray

from replistream import Query, seconds
from replistream.engines.ray import deploy
from replistream.testing import Call, assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")

CHUNK_MS = 50


def join_query(window_s: float = 2.0) -> Query:
    q = Query("join-move")
    left = q.source("l", {"k": "i8", "x": "i8"}, punctuate_every=seconds(CHUNK_MS / 1000))
    right = q.source("r", {"k": "i8"}, punctuate_every=seconds(CHUNK_MS / 1000))
    left.join(right, window=seconds(window_s), on="k", name="op").sink("out")
    return q.build()


def join_inputs(event_s: float = 8.0, per_chunk: int = 40, keys: int = 2000, seed: int = 3) -> dict:
    """Both sides: ``per_chunk`` tuples of random keys every 50 ms of event time."""
    rng = np.random.default_rng(seed)
    step = seconds(CHUNK_MS / 1000)
    lefts, rights = [], []
    for i in range(int(event_s * 1000 / CHUNK_MS)):
        ts = i * step + np.sort(rng.integers(0, step, per_chunk))
        lefts.append({"ts": ts, "k": rng.integers(0, keys, per_chunk), "x": rng.integers(0, 9, per_chunk)})
        ts = i * step + np.sort(rng.integers(0, step, per_chunk))
        rights.append({"ts": ts, "k": rng.integers(0, keys, per_chunk)})
    return {"l": lefts, "r": rights}


class Background:
    """A deployment call in a thread, so the feeder keeps feeding while the state moves."""

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

    def join(self, timeout=300):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the move did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def links_into(dep, label: str) -> list[dict]:
    """Every live upstream actor's stream replicas into ``label`` (their stats, with ``replayed``)."""
    out = []
    for lab, h in dep.handles.items():
        if not dep.topology.is_running(lab):
            continue
        out += [lk for lk in ray.get(h.stats.remote(), timeout=60)["links"] if lk["to"] == label]
    return out


def move_in_background(bg: Background, **kw):
    def start(dep):
        target = [s for s in dep.servers if s != dep.actor_server["op#0"]][0]
        bg.start(lambda: dep.move_replica("op", 0, target, strategy="fluid", bits=12, **kw))
    return start


@pytest.mark.slow
def test_a_join_moved_fluidly_at_2p12_bins_with_its_window_full_needs_no_replay():
    """k = 1 (the moving replica is the only one serving): the Join's 2-s window has been full
    for 1 s when the move starts; 4,096 one-bin steps; the output equals the reference, the new
    replica's links from the entry points replayed nothing, and the progress record says what
    the pacing did."""
    q = join_query()
    data = join_inputs(event_s=10.0)
    bg = Background()

    def started(dep):
        """If the new actor is still starting 3 s later (a loaded machine), hold the feed until its
        transfer has begun (a wait on the progress record), so the steps overlap the stream."""
        deadline = time.time() + 240
        while not dep.transfers() and (bg.thread is None or bg.thread.is_alive()):
            assert time.time() < deadline, "the transfer never started"
            time.sleep(0.01)

    at, later = int(3.0 * 1000 / CHUNK_MS), int(6.0 * 1000 / CHUNK_MS)  # the window (2 s) is full at 3 s
    inputs = {"l": data["l"][:at] + [Call(move_in_background(bg))] + data["l"][at:later] + [Call(started)]
              + data["l"][later:], "r": data["r"]}
    ref = run_reference(q, data)
    with deploy(q, servers=3, k=1) as dep:
        res = dep.run(inputs, pace=1.0, timeout=300)
        ev = bg.join()
        assert res.complete
        assert_same_output(ref.outputs["out"], res.outputs["out"])
        assert not res.dead_letter_summary()
        (new,) = ev["new_replicas"]
        h = ev["handover"][new["label"]]
        assert h["strategy"] == "fluid" and h["steps"] == 4096
        (tr,) = dep.transfers()
        assert tr["state"] == "complete" and tr["done"] == 4096
        # no replay from the entry points: the links were added without it, and no fallback
        assert tr["replay"] is False and h["replay"] is False
        assert tr["replay_fallback"] is None
        assert len(tr["gate"]) == 2  # one connect mark per input port
        links = links_into(dep, new["label"])
        assert {lk["port"] for lk in links} == {0, 1}
        assert all(lk["replayed"] == 0 for lk in links), links
        # the pacing's record: punctuations at which a step waited, by reason; the sender's lag
        assert set(tr["deferred"]) == {"gate", "receiver", "lag", "output"}
        assert tr["sends"] >= 1 and (tr["gate_s"] is None or tr["gate_s"] >= 0)  # None: all taken at the end
        assert tr["lag_ms"] is None or tr["lag_ms"]["max"] >= tr["lag_ms"]["base"]
        assert not dep.alive["op#0"] and dep.alive[new["label"]]


@pytest.mark.slow
def test_a_move_whose_input_pauses_before_the_gate_opens_falls_back_to_a_replay():
    """The feed stops right after the move starts: the sender's punctuations stay below the connect
    marks (an entry point punctuates behind its data), so the coordinator subscribes the receiver
    again with replay and lifts the gate; once the feed resumes the move completes and the output
    stays exact."""
    q = join_query()
    data = join_inputs(event_s=5.0)
    bg = Background()

    def wait_for_the_fallback(dep):
        """Hold the feed until the transfer has fallen back to a replay (or the move ended)."""
        deadline = time.time() + 240
        while bg.thread is None or bg.thread.is_alive():
            if any(t.get("replay_fallback") for t in dep.transfers()):
                return
            assert time.time() < deadline, "no fallback while the input paused"
            time.sleep(0.02)

    at = int(3.0 * 1000 / CHUNK_MS)
    inputs = {"l": data["l"][:at] + [Call(move_in_background(bg)), Call(wait_for_the_fallback)] + data["l"][at:],
              "r": data["r"]}
    ref = run_reference(q, data)
    with deploy(q, servers=3, k=1) as dep:
        res = dep.run(inputs, pace=2.0, timeout=300)
        ev = bg.join()
        assert res.complete
        assert_same_output(ref.outputs["out"], res.outputs["out"])
        (tr,) = dep.transfers()
        assert tr["state"] == "complete" and tr["replay"] is False and tr["done"] == 4096
        fb = tr["replay_fallback"]
        assert fb is not None and "paused" in fb["why"], fb
        assert any(a < g for a, g in zip(fb["sender_punct"], fb["gate"]))
        (new,) = ev["new_replicas"]
        links = links_into(dep, new["label"])
        # the links added without replay, and those of the fallback (one more per entry point and port)
        assert len(links) == 4 and sum(lk["replayed"] > 0 for lk in links) >= 1, links

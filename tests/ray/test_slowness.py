"""Issue #28 on Ray: slow is the new dead. A replica that stops answering (SIGSTOP) is detected and
masked like one that crashed; nothing waits on one replica; a dropped link is a failure of that link;
a tuple below its own channel's punctuation is the sender's broken contract, never a late dead letter;
the sender thread's errors are reported; restore() re-times queued packets; the transfer worker never
takes the actor's lock under its own (docs/reliability.md, "Slow is dead")."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import ray

from replistream import Query, RunFailed, deploy, seconds
from replistream.sources import Call, StopReplica, inject_at
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")

SERVERS = ["boston", "london", "tokyo"]
#: tight bounds keep the tests short; still 4x and 12x the worst probe answer seen under CI load
DETECT = {"suspect_after_s": 1.0, "fail_after_s": 3.0}


def query(window: bool = True):
    q = Query("slow")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    f = s.filter(lambda b: b["v"] > -1.0, name="pick")
    if window:
        f = f.window(size=seconds(2), by="k", aggs={"n": "count", "sv": ("v", "sum")}, name="per_k")
    f.sink("out")
    return q.build()


def inputs(n=3000, span_s=30, chunk=50, seed=1):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(span_s), n))
    k, v = rng.integers(0, 8, n), rng.normal(size=n)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, n, chunk)]}


def exact(ref, res):
    assert res.complete
    for app in ref.outputs:
        assert_same_output(ref.outputs[app], res.outputs[app])


def events(dep, kind, actor=None):
    return [e for e in dep.events if e.get("event") == kind and (actor is None or e.get("actor") == actor)]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie is gone too: it runs nothing (its parent has not reaped it yet)
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.parametrize("target", [("per_k", 0), ("entry", 0)])
def test_a_stopped_replica_is_declared_failed_killed_and_masked(target):
    q = query()
    data = inputs()
    ref = run_reference(q, data)
    data["s"] = inject_at(data["s"], seconds(10), StopReplica(*target))
    label = f"{target[0]}#{target[1]}"
    with deploy(q, servers=SERVERS, k=2, **DETECT) as dep:
        res = dep.run(data, pace=4.0, timeout=120)
        declared = events(dep, "declared_failed", label)
        assert declared, f"{label} was stopped and never declared failed: {dep.events[-10:]}"
        assert events(dep, "suspected", label)
        assert not dep.topology.is_running(label)
        pid = dep._pids[label][0]
        deadline = time.time() + 10
        while not gone(pid):
            assert time.time() < deadline, f"{label}'s stopped process {pid} was never killed (fenced)"
            time.sleep(0.05)
        others = [e["actor"] for e in events(dep, "declared_failed") if e["actor"] != label]
    assert others == [], f"healthy replicas declared failed: {others}"
    exact(ref, res)
    assert not [d for d in res.dead_letters if "late" in d.reason]


@pytest.mark.slow
def test_a_stopped_application_replica_holds_nothing():
    q = query(window=False)
    data = inputs(n=1500)
    ref = run_reference(q, data)
    data["s"] = inject_at(data["s"], seconds(8), StopReplica("out", 1))
    with deploy(q, servers=SERVERS, k=2, app_replicas=2, **DETECT) as dep:
        res = dep.run(data, pace=4.0, timeout=120)
        assert events(dep, "declared_failed", "out#1")
    exact(ref, res)


@pytest.mark.slow
def test_a_replica_stopped_briefly_is_suspected_then_cleared_not_failed():
    q = query()
    data = inputs()
    ref = run_reference(q, data)
    resume = threading.Event()

    def resume_later(dep):
        def go():
            deadline = time.time() + 30
            while not events(dep, "suspected", "per_k#1") and time.time() < deadline:
                time.sleep(0.02)
            dep.resume_replica("per_k", 1)
            resume.set()
        threading.Thread(target=go, daemon=True).start()

    data["s"] = inject_at(data["s"], seconds(10), StopReplica("per_k", 1))
    data["s"] = inject_at(data["s"], seconds(10), Call(resume_later))
    with deploy(q, servers=SERVERS, k=2, suspect_after_s=1.0, fail_after_s=20.0) as dep:
        res = dep.run(data, pace=4.0, timeout=120)
        assert resume.wait(30)
        deadline = time.time() + 10
        while not events(dep, "cleared", "per_k#1"):
            assert time.time() < deadline, "per_k#1 answered again but was never cleared"
            time.sleep(0.05)
        assert dep.topology.is_running("per_k#1") and not events(dep, "declared_failed")
    exact(ref, res)


@pytest.mark.slow
def test_a_replica_declared_failed_while_stopped_is_fenced_when_resumed():
    """Resuming a replica after it was declared failed resumes nothing: its process was killed."""
    q = query()
    data = inputs()
    ref = run_reference(q, data)
    data["s"] = inject_at(data["s"], seconds(8), StopReplica("pick", 0))
    with deploy(q, servers=SERVERS, k=2, **DETECT) as dep:
        dep.feed(data, pace=4.0)
        deadline = time.time() + 60
        while not events(dep, "declared_failed", "pick#0"):
            assert time.time() < deadline, "pick#0 was never declared failed"
            dep.check_failures()
            time.sleep(0.05)
        dep.resume_replica("pick", 0)  # SIGCONT to a process that no longer exists
        pid = dep._pids["pick#0"][0]
        deadline = time.time() + 10
        while not gone(pid):
            assert time.time() < deadline, "the declared-failed replica still runs after SIGCONT"
            time.sleep(0.05)
        assert dep.wait(120)
        res = dep.collect()
    exact(ref, res)


@pytest.mark.slow
def test_a_dropped_link_is_reconnected_and_a_starved_receiver_is_declared_failed():
    q = query()
    data = inputs()
    ref = run_reference(q, data)

    def drop(sender):
        return Call(lambda dep: ray.get(dep.handles[sender].drop_link.remote("per_k#0", "receiver slow: test"), timeout=30))

    data["s"] = inject_at(data["s"], seconds(8), drop("pick#0"))
    with deploy(q, servers=SERVERS, k=2, **DETECT) as dep:
        dep.feed(data, pace=4.0)
        deadline = time.time() + 30
        while not events(dep, "link_failed"):
            assert time.time() < deadline, "the dropped link was never reported"
            time.sleep(0.05)
        assert dep.topology.is_running("per_k#0"), "per_k#0 is still fed by pick#1: it must stay"
        while not events(dep, "link_reconnected"):  # both ends run and the link is up: reconnected
            assert time.time() < deadline + 15, f"the dropped link was never reconnected: {dep.events[-8:]}"
            time.sleep(0.05)
        assert events(dep, "link_reconnected")[0]["from"] == "pick#0"
        ray.get([dep.handles[p].drop_link.remote("per_k#0", "receiver slow: test") for p in ("pick#0", "pick#1")],
                timeout=30)
        while not events(dep, "declared_failed", "per_k#0"):
            assert time.time() < deadline + 30, "per_k#0 lost every input link and was never declared failed"
            time.sleep(0.05)
        assert "no live upstream replica feeds" in events(dep, "declared_failed", "per_k#0")[0]["reason"]
        assert dep.wait(120)
        res = dep.collect()
    exact(ref, res)


def _break_contract(sender: str, receiver: str, port: int = 0):
    """A packet from ``sender`` (on its own channel) below the punctuation it already delivered."""
    def go(dep):
        sid = next(s for s in dep.topology.streams(src=sender, dst=receiver))
        channel = dep.topology.channel(sid.id)
        late = dep.query.schema_of("pick").from_columns({"ts": [0], "k": [1], "v": [0.5]}, ids=[12345])
        ray.get(dep.handles[receiver].push.remote(port, channel, [late], dep.channel_opts["epoch"], sender),
                timeout=30)
    return Call(go)


@pytest.mark.slow
def test_a_tuple_below_its_channels_punctuation_fails_the_sender_not_a_late_dead_letter():
    q = query()
    data = inputs()
    ref = run_reference(q, data)
    data["s"] = inject_at(data["s"], seconds(10), _break_contract("pick#0", "per_k#1"))
    with deploy(q, servers=SERVERS, k=2, **DETECT) as dep:
        res = dep.run(data, pace=4.0, timeout=120)
        broken = [e for e in dep.events if e.get("event") == "broken_contract"]
        assert broken and broken[0]["sender"] == "pick#0" and broken[0]["receiver"] == "per_k#1"
        assert events(dep, "declared_failed", "pick#0")
    exact(ref, res)
    assert not [d for d in res.dead_letters if "late" in d.reason], "a broken contract became a late dead letter"


@pytest.mark.slow
def test_a_broken_contract_without_a_peer_ends_the_run_naming_sender_receiver_and_time():
    q = query()
    data = inputs()
    data["s"] = inject_at(data["s"], seconds(10), _break_contract("pick#0", "per_k#0"))
    with deploy(q, servers=SERVERS, k=1, **DETECT) as dep:
        with pytest.raises(RunFailed, match=r"every replica of 'pick' is lost: pick#0 \(declared failed: sent 1 "
                                            r"tuple\(s\) from ts=0 .* to per_k#0 .*logical time"):
            dep.run(data, pace=4.0, timeout=120)


@pytest.mark.slow
def test_a_link_cut_without_a_duration_delivers_its_queue_once_restored():
    q = query()
    data = inputs(n=1500)
    ref = run_reference(q, data)
    data["s"] = inject_at(data["s"], seconds(5), Call(lambda dep: dep.cut_link("boston", "london")))
    data["s"] = inject_at(data["s"], seconds(8), Call(lambda dep: dep.restore("boston", "london")))
    placement = {"entry": ["boston"], "pick": ["boston"], "per_k": ["london"], "out": ["tokyo"]}
    with deploy(q, servers=SERVERS, k=1, placement=placement, **DETECT) as dep:
        res = dep.run(data, pace=4.0, timeout=120)
        assert not events(dep, "declared_failed") and not events(dep, "link_failed")
    exact(ref, res)


@pytest.mark.slow
def test_an_upstream_channel_added_while_a_staged_transfer_installs_steps():
    """The lock order: add_channel (what connecting a new upstream replica calls at its receiver)
    takes lock then staged_lock; the transfer worker never takes lock under staged_lock, so adding
    channels while a fluid move installs its steps cannot deadlock."""
    q = query()
    data = inputs(n=2400, span_s=24)
    ref = run_reference(q, data)
    done, threads = {"channels": 0}, []

    def move_and_add(dep):  # beside the feeder (a sentinel runs in its thread, which must go on feeding)
        def add():
            deadline = time.time() + 60
            while time.time() < deadline:
                running = [t for t in dep.transfers() if t["state"] == "running" and t["done"] > 0]
                if running:
                    h = dep.handles[running[0]["replica"]]
                    while dep.transfers()[0]["state"] == "running" and time.time() < deadline:
                        ray.get(h.add_channel.remote(0), timeout=10)  # a deadlock would time out here
                        done["channels"] += 1
                    return
                time.sleep(0.005)

        def move():
            done["move"] = dep.move_replica("per_k", 0, "tokyo", strategy="fluid", bits=6, pause_ms=0)
        threads.extend(threading.Thread(target=f, daemon=True) for f in (add, move))
        for t in threads:
            t.start()

    data["s"] = inject_at(data["s"], seconds(8), Call(move_and_add))
    with deploy(q, servers=SERVERS, k=2, **DETECT) as dep:
        res = dep.run(data, pace=2.0, timeout=180)
        for t in threads:
            t.join(120)
    assert "move" in done, "the move never finished"
    assert done["channels"] > 0, "no channel was added while the transfer installed its steps"
    exact(ref, res)


def test_the_sender_threads_errors_are_reported_not_printed():
    from replistream.engines.ray.channels import Link, Outbox, Sender
    from replistream.schema import Schema

    class Broken:
        def latency_ms(self, a, b, t):
            raise RuntimeError("latency model broke")

    errors = []
    got = threading.Event()
    ob = Outbox("f#0", "a", Broken(), time.time(), flush_ms=1.0)
    ob.add_link(Link("g#0", "b", None, 0, 0))
    sender = Sender([ob], on_error=lambda e: (errors.append(e), got.set()))
    sender.start()
    try:
        ob.emit([Schema({"x": "i8"}).from_columns({"ts": [1], "x": [1]})])  # flushed by the sender on time
        assert got.wait(10), "the sender thread's error never reached its reporter"
    finally:
        sender.stop()
    assert "latency model broke" in str(errors[0])
    assert ob.links[0].queue == type(ob.links[0].queue)() and ob.log.tuples == 0  # nothing half-sent


@pytest.mark.slow  # a full Ray run with kill, revive, kill (#31: out of the quick subset)
def test_dead_letters_survive_kill_revive_kill_of_the_same_operator():
    """Dead letters are state: kill pick#0, revive it from pick#1, kill pick#1; the replica left holds
    what both set aside (through its checkpoint), so result.dead_letters equals the reference's."""
    from replistream.sources import KillReplica, Revive

    def raising(b):
        if (b["k"] == 3).any():
            raise ValueError("k is 3")
        return b["v"] > -1.0

    q = Query("letters")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.filter(raising, name="pick").window(size=seconds(2), by="k", aggs={"n": "count"}, name="per_k").sink("out")
    q.build()
    data = inputs(n=1500)
    ref = run_reference(q, data)
    data["s"] = inject_at(data["s"], seconds(8), KillReplica("pick", 0))
    data["s"] = inject_at(data["s"], seconds(14), Revive("pick", 0))
    data["s"] = inject_at(data["s"], seconds(20), KillReplica("pick", 1))
    with deploy(q, servers=SERVERS, k=2, **DETECT) as dep:
        res = dep.run(data, timeout=120)
        assert [r.label for r in dep.topology.replicas("pick") if dep.topology.is_running(r.label)] == ["pick#2"]

    def letters(r):
        return sorted((d.where, d.reason, int(i)) for d in r.dead_letters for i in d.batch["id"])
    exact(ref, res)
    assert len(letters(ref)) > 20 and letters(res) == letters(ref)


def test_a_paced_run_sets_aside_a_record_stamped_with_the_reserved_end_time():
    """Pacing never waits for a record the entry points will set aside: a chunk at END (the reserved
    timestamp) once made the feeder's sleep() overflow and end the run."""
    from replistream.schema import END

    q = query(window=False)
    data = inputs(n=400, span_s=4)
    data["s"].insert(len(data["s"]) // 2, [{"ts": int(END), "k": 1, "v": 0.5}])
    ref = run_reference(q, data, on_malformed="dead_letter")
    with deploy(q, servers=SERVERS, k=2, **DETECT) as dep:
        res = dep.run(data, pace=4.0, timeout=60)
    exact(ref, res)
    assert [d.reason for d in res.dead_letters] == [d.reason for d in ref.dead_letters] and ref.dead_letters

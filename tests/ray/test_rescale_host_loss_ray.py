"""A detached deployment's host SIGKILLed around a rescale (``dep.rescale``, issue #41;
replistream/engines/ray/rescale.py, ``resume``): in the middle of the move, just before it starts
(its record written, nothing else), with its new partitions started but not yet switched to,
once every step is installed but before its record is written, and just after. Each time the
next host takes the deployment up (replistream/engines/ray/lifecycle.py), finishes the rescale
once, the client's ``rescale()`` call returns its record (sent again to the new host with its id),
and the output equals the reference run as a multiset.

Every fault is placed by the host itself, not by a sleep: a ``Call`` sentinel in the input (run by
the host's feeder, which waits there) installs the test's hook in the host's process, and holds
the feed until the rescale has cut its steps, so ``T0`` is where the sentinel stands plus the
rescale's lead (``GATE_LEAD_S`` of the 4x replay's event time: 1 s). The hook
kills the host at its point of the rescale; in the middle of the move, a second sentinel holds the
feed before the last step's time until a taking replica installed a step, then kills the host."""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

import replistream as rs
from replistream import ParquetSink, seconds
from replistream.sources import Call, inject_at
from replistream.testing import assert_same_output, run_reference

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("detached_driver", HERE / "scripts" / "detached_driver.py")
driver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(driver)
_spec = importlib.util.spec_from_file_location("test_detached", HERE / "test_detached.py")
detached = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(detached)


def _chunks(seed: int, n: int = 6000, keys: int = 500, span_s: float = 24.0) -> list[dict]:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(0, seconds(span_s), n))
    return [{"ts": t[a:a + 100], "k": rng.integers(0, keys, 100), "v": rng.normal(size=100)} for a in range(0, n, 100)]


def _gate(where: str):
    """The sentinel that places the fault (run in the host: defined here, it travels by value)."""

    def gate(dep):
        import os
        import signal
        import threading
        import time

        from replistream.engines.ray import rescale as R

        if any(e.get("event") == "control_restored" for e in dep.events):
            return  # (the host that took the deployment up: the fault was placed already)

        def die():
            os.kill(os.getpid(), signal.SIGKILL)

        if where == "before_start":  # its record written ("starting"), nothing else done
            keep = R._keep

            def hook(d, kept):
                keep(d, kept)
                if kept is not None and kept["phase"] == "starting":
                    die()
            R._keep = hook
        elif where == "partitions_started":  # the new partitions started and connected, no switch yet
            start = R._start_partitions

            def hook(*args, **kwargs):
                start(*args, **kwargs)
                die()
            R._start_partitions = hook
        elif where == "steps_installed":  # every step installed (and given), its record not yet logged
            record = dep.record_change

            def hook(rec):
                if rec.get("change") == "rescale":
                    die()
                return record(rec)
            dep.record_change = hook
        elif where == "recorded":  # its record logged and written, the answer not yet sent to the client
            keep = R._keep

            def hook(d, kept):
                keep(d, kept)
                if kept is None:
                    die()
            R._keep = hook
        dep.events.append({"t": dep.now(), "event": "test_gate", "where": where})
        deadline, tick = time.time() + 120, threading.Event()
        while (getattr(dep, "_rescale_in_flight", None) or {}).get("phase") != "moving":  # its steps cut at T0 here
            assert time.time() < deadline, "no rescale reached its switch within 120 s"
            tick.wait(0.005)
    return gate


def _mid_move(taking: str):
    """The second sentinel of the mid-move case (the feed waits there, before the last steps' times):
    once a replica of the taking partition installed a step, the host is killed (made here: a
    nested function travels by value to the host). ``taking``: the taking partition ("per_k.1")."""

    def kill_mid_move(dep):
        import os
        import signal
        import threading
        import time

        import ray as _ray

        if any(e.get("event") == "control_restored" for e in dep.events):
            return
        deadline, tick = time.time() + 120, threading.Event()
        while True:
            st = [_ray.get(h.moves_status.remote(), timeout=60) for _, h in dep.topology.running(taking)]
            if any(s["installed"] >= 1 for s in st):
                break
            assert time.time() < deadline, f"no step installed within 120 s: {st}"
            tick.wait(0.01)
        assert all(s["take"] for s in st), st  # steps are left: the feed waits before their times
        dep.events.append({"t": dep.now(), "event": "test_mid_move", "installed": [s["installed"] for s in st]})
        dep._persister.persist_now()  # (the event kept, for the test to see)
        os.kill(os.getpid(), signal.SIGKILL)
    return kill_mid_move


def _events_until(dep, event: str, limit: float = 120.0) -> None:
    deadline = time.time() + limit
    while not any(e.get("event") == event for e in dep.events):
        assert time.time() < deadline, f"no {event!r} event within {limit:g} s"
        time.sleep(0.05)


@pytest.mark.parametrize("where", ["mid_move", "before_start", "partitions_started", "steps_installed", "recorded",
                                   "fewer_mid_move"])
def test_the_host_lost_around_a_rescale_finishes_it_once_and_the_call_gets_its_record(tmp_path, where):
    """1 -> 2 partitions (``fewer_mid_move``: 2 -> 1, the leaving partition retired by the next host),
    fluid, 64 steps 100 ms of event time apart from T0 (at 6 s of input, plus the lead: 7 s), the
    mid-move cases' second sentinel at 8 s: the host is lost at ``where``; the next host resumes (``control_restored["rescale"]``: the phase it
    found) and finishes the rescale, the client's call (the same id, sent again by the client to the
    host that serves) returns the record of the one rescale made, and the output is exact."""
    name = f"rs-loss-{where.replace('_', '-')}"
    in_dir = detached.write_inputs(tmp_path / "in", files=1, rows=10)  # (only for the query's schema)
    q = driver.build(in_dir)
    chunks = _chunks(seed=17)
    mid, fewer = where.endswith("mid_move"), where.startswith("fewer")
    data = inject_at(chunks, seconds(6), Call(_gate("none" if mid else where)))
    if mid:
        data = inject_at(data, seconds(8), Call(_mid_move("per_k.0" if fewer else "per_k.1")))
    ref = run_reference(q, {"s": chunks})
    out_dir = str(tmp_path / "out")
    dep = rs.deploy(q, servers=3, k=2, name=name, detached=True, parallelism={"per_k": 2 if fewer else 1}, bits=7,
                    sinks={"out": ParquetSink(out_dir, every=seconds(2))})
    try:
        dep.feed({"s": data}, pace=4.0)
        _events_until(dep, "test_gate")
        rec = dep.rescale("per_k", 1 if fewer else 2, strategy="fluid", gap_ms=100.0, timeout=120.0)
        assert dep.wait(180)
        events, changes, parts = dep.events, dep.changes, dep.partitions("per_k")
    finally:
        dep.stop()
    (restored,) = [e for e in events if e.get("event") == "control_restored"]
    phase = {"mid_move": "moving", "fewer_mid_move": "moving", "before_start": "starting", "partitions_started": "starting",
             "steps_installed": "moving", "recorded": None}[where]
    assert (restored["rescale"] or {}).get("phase") == phase, restored["rescale"]
    assert rec.get("resumed") == phase, rec  # (the record made by the host that resumed it)
    assert rec["steps"] == 64 and rec["bins_moved"] == 64 and (rec["from"], rec["to"]) == ((2, 1) if fewer else (1, 2)), rec
    assert rec.get("call"), rec
    made = [c for c in changes if c.get("change") == "rescale"]
    assert len(made) == 1 and made[0]["at"] == rec["at"] and made[0]["call"] == rec["call"], made
    assert parts == (1 if fewer else 2)
    if fewer:  # the leaving partition retired by the host that resumed the rescale
        assert sorted(rec["retired_replicas"]) == ["per_k.1#0", "per_k.1#1"], rec
    if where == "partitions_started":  # the new partition's replicas, never recorded, were stopped; new ones started
        assert sorted(restored["rolled_back"]) == ["per_k.1#0", "per_k.1#1"], restored
        assert sorted(rec["new_replicas"]) == ["per_k.1#2", "per_k.1#3"], rec
    if mid:
        assert any(e.get("event") == "test_mid_move" for e in events)
    assert not any(e.get("event") == "run_failed" for e in events), [e for e in events if e.get("event") == "run_failed"]
    assert_same_output(ref.outputs["out"], ParquetSink(out_dir).read())


def test_a_rescale_the_next_host_cannot_finish_ends_the_run_loudly_and_the_call_says_why(tmp_path):
    """The host is lost just as a rescale begins (its record written, nothing else) with the whole
    input fed: the next host starts the new partition again, but once the resumed feed has ended
    the source, no switch time past every tuple fed can be placed. The run ends loudly
    (``status()["failure"]``, ``wait()`` raises) naming the operator, the partition and that the
    switch time was never taken, and the client's call raises the same ``RunFailed`` (no hang)."""
    from replistream.errors import RunFailed

    name = "rs-loss-unfinishable"
    in_dir = detached.write_inputs(tmp_path / "in", files=1, rows=10)  # (only for the query's schema)
    q = driver.build(in_dir)
    chunks = _chunks(seed=19, n=2000, span_s=8.0)
    data = [*chunks, Call(_gate("before_start"))]  # (after the last chunk, before the source's end)
    dep = rs.deploy(q, servers=3, k=2, name=name, detached=True, parallelism={"per_k": 1}, bits=7,
                    sinks={"out": ParquetSink(str(tmp_path / "out"), every=seconds(2))})
    try:
        dep.feed({"s": data}, pace=None)
        _events_until(dep, "test_gate")
        with pytest.raises(RunFailed) as raised:
            dep.rescale("per_k", 2, strategy="fluid", gap_ms=100.0, timeout=60.0)
        failure = dep.status()["failure"]
        with pytest.raises(RunFailed):
            dep.wait(60)
        events = dep.events
    finally:
        dep.stop()
    (restored,) = [e for e in events if e.get("event") == "control_restored"]
    assert (restored["rescale"] or {}).get("phase") == "starting", restored["rescale"]
    for said in (str(raised.value), failure):
        assert said and "'per_k' from 1 to 2 partitions" in said and "per_k.1" in said, said
        assert "cut short before its switch time was taken" in said and "every source has ended" in said, said

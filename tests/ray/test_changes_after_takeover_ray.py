"""A change of the running query issued right after a detached deployment's host was lost and the
next one took it up (replistream/engines/ray/lifecycle.py, ``Ingest.resume_feed``). The restored
feeder has sent nothing yet, so it does not know the largest timestamp fed before the loss; a
change placed then at what it does know (``Feeder.marker_time``: nothing, the smallest time)
would switch tuples already processed under the old query. The change waits until every open
source has sent since the resume (plus each source's ``max_disorder``, as a rescale resumed after
a restore does: ``rescale._resumed_floor``), so its time is past everything fed before the loss and
the output equals the reference run of the changed query.

Placed by sentinels, not sleeps: the first kills the host once everything before it reached the
entry points; the second, run first by the restored feeder, holds the resumed feed (nothing sent)
until the change was made or says it waits for the feed."""
from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest
import ray

import replistream as rs
from replistream import ParquetSink, Query, seconds
from replistream.sources import Call, inject_at
from replistream.testing import assert_same_output, run_reference

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]

_spec = importlib.util.spec_from_file_location("cp_loss", Path(__file__).parent / "test_control_plane_loss.py")
cp_loss = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cp_loss)

AT = seconds(6)  # where the host is lost, in event time


def _die(dep):
    """Kill the host (the lost one only: a restored feed does not run a sentinel twice)."""
    import os
    import signal

    if dep.feeder.resumed is None:
        os.kill(os.getpid(), signal.SIGKILL)


def _hold(dep):
    """In the restored host, before the resumed feed sends anything: wait (120 s at most) until a
    change was made (a rescale: its switch time cut) or a change waits for the feed (a
    ``change_waits_for_feed`` event)."""
    import threading
    import time

    if dep.feeder.resumed is None:
        return
    dep.events.append({"t": dep.now(), "event": "test_hold"})
    deadline, tick = time.time() + 120, threading.Event()
    while not (dep.changes or any(e.get("event") == "change_waits_for_feed" for e in dep.events)
               or (dep._rescale_in_flight or {}).get("phase") == "moving"):  # (a rescale: its switch time cut)
        assert time.time() < deadline, "no change was issued within 120 s of the take-over"
        tick.wait(0.01)


def _until(fn, what: str, limit: float = 120.0):
    deadline = time.time() + limit
    while not fn():
        assert time.time() < deadline, f"{what}: not within {limit:g} s"
        time.sleep(0.05)


@pytest.mark.parametrize("change", ["replace_function", "add_operator", "rescale"])
def test_a_change_right_after_the_take_over_is_placed_after_everything_fed_before_the_loss(tmp_path, change):
    """The host is SIGKILLed at 6 s of event time; once the next host took the deployment up (its
    resumed feed held before its first chunk), ``change`` is issued: its time ``p`` is at least the
    largest timestamp fed before the loss, and the output of every application equals the
    reference run of the changed query. A rescale (``per_k`` deployed as one partition, to two, all
    at once) is placed likewise: its switch time ``at`` is past what was fed before the loss."""
    name = f"cp-takeover-{change.replace('_', '-')}"
    q = Query("takeover-change")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.filter(lambda b: b["v"] > -1.0, name="keep").window(size=seconds(2), by="k", aggs={"n": "count"},
                                                         name="per_k").sink("out")
    q.build()
    chunks = cp_loss._keyed_chunks(seed=17, n=4000, keys=20)
    fed_before = max(int(t) for c in chunks for t in c["ts"] if t < AT)
    out_dir = str(tmp_path / "out")
    parts = {"parallelism": {"per_k": 1}, "bits": 6} if change == "rescale" else {}
    dep = rs.deploy(q, servers=3, k=2, name=name, detached=True, sinks={"out": ParquetSink(out_dir, every=seconds(2))},
                    **parts)
    try:
        pid = ray.get(cp_loss._host(name).process.remote(), timeout=60)["pid"]
        dep.feed({"s": inject_at(chunks, AT, Call(_die), Call(_hold))}, pace=2.0)
        # the next host serves, its feed resumed and held at the second sentinel
        _until(lambda: ray.get(cp_loss._host(name).process.remote(), timeout=60)["pid"] != pid,
               "no other host served")
        _until(lambda: any(e.get("event") == "test_hold" for e in dep.events), "the resumed feed did not start")
        out: dict = {}

        def issue():
            try:
                if change == "replace_function":
                    out["rec"] = dep.replace_function("keep", lambda b: b["v"] > 0.0)
                elif change == "rescale":
                    out["rec"] = dep.rescale("per_k", 2, strategy="all-at-once", timeout=120.0)
                else:
                    out["rec"] = dep.add_operator("per_k", lambda st: st.filter(lambda b: b["n"] > 1, name="busy")
                                                  .sink("busy_out"))
            except Exception as e:  # noqa: BLE001 - judged below
                out["error"] = e

        t = threading.Thread(target=issue, name="test-change")
        t.start()
        t.join(timeout=180)
        assert not t.is_alive(), f"{change}() did not return within 180 s of the take-over"
        assert "error" not in out, f"{change}() failed after the take-over: {out.get('error')!r}"
        rec = out["rec"]
        at = rec["at"] if change == "rescale" else rec["p"]
        assert at >= fed_before, (f"{change}() was placed at ts {at}, before ts {fed_before} that was fed before "
                                  f"the host was lost", rec)
        assert dep.wait(180)
        events, changed = dep.events, dep.query
        got = {app: dep.results(app) for app in changed.sinks if app != "out"}
    finally:
        dep.stop()
    assert any(e.get("event") == "control_restored" for e in events)
    waited = [e for e in events if e.get("event") == "change_waits_for_feed"]
    assert [(e["change"], e["sources"]) for e in waited] == [(change, ["s"])], waited
    ref = run_reference(changed, {"s": chunks})
    plain = run_reference(q, {"s": chunks})
    if change == "replace_function":  # (the change changes the output: the test can tell)
        assert sorted(ref.outputs["out"].tolist()) != sorted(plain.outputs["out"].tolist())
    elif change == "add_operator":
        assert len(ref.outputs["busy_out"]) > 0
    assert_same_output(ref.outputs["out"], ParquetSink(out_dir).read())
    for app, rows in got.items():
        assert_same_output(ref.outputs[app], rows)


def test_after_a_restore_marker_time_waits_for_every_open_source_and_adds_the_largest_max_disorder():
    """The feeder's side, without a host: after a resume at chunk 10 of ``a`` and 4 of ``b`` (``c``
    ended before it), ``marker_time`` refuses in one line naming the open sources the resumed feed
    sent nothing of (a marker it sent first is not a chunk); once each sent one, it is the largest
    timestamp sent since plus the sources' largest ``max_disorder``. Without a resume: no slack."""
    from replistream.engines.ray.feeder import Feeder

    f = Feeder(None, on_start=print, on_sentinel=print, on_entry_failed=print)
    f.sources, f.open_sources, f.feeding = ["a", "b", "c"], {"a", "b"}, True
    f.disorder = {"a": 500, "b": 2_000, "c": 0}
    f.resumed = {"at": {"a": {"seq": 10, "rows": 0, "closed": False}, "b": {"seq": 4, "rows": 0, "closed": False},
                        "c": {"seq": 7, "rows": 0, "closed": True}}, "behind": {}, "markers": [("a", object())]}
    f.seqs = {"a": 11, "b": 4, "c": 7}  # a: only the marker; b: nothing yet
    assert f.unsent_since_resume() == ["a", "b"]
    with pytest.raises(RuntimeError, match=r"sent nothing of source\(s\) \['a', 'b'\] yet") as e:
        f.marker_time()
    assert "\n" not in str(e.value)
    f.seqs, f.max_fed = {"a": 12, "b": 4, "c": 7}, seconds(3)
    with pytest.raises(RuntimeError, match=r"\['b'\]"):
        f.marker_time()
    f.seqs["b"] = 5
    assert f.unsent_since_resume() == []
    assert f.marker_time() == seconds(3) + 2_000
    f.resumed = None  # a feed never resumed: the largest timestamp sent
    assert f.marker_time() == seconds(3)

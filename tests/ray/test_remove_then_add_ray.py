"""``remove_operator`` then, later in the same feed, ``add_operator`` (Bartnik §3), k=2: the added
application's output equals the reference run of the query as changed (``dep.query``), as a
multiset, and ``run()`` ends complete.

The order matters: once the removal has ended every application there was, the wait of ``run()``
sees every application at the end of the stream while the feed still runs; the application added
afterwards must be waited for too (it was not: ``run()`` returned with 0-74 of its 91 tuples
fetched and ``complete`` False, one ``poll()`` later fetching the rest). Each test holds the
feed until the removed application got its end (``_until_ended``), so the run is in that state
every time. A removed node's name cannot be taken again (refused in one line, nothing changed),
so the labels the results are fetched by are never reused."""
from __future__ import annotations

import time

import numpy as np
import pytest

from replistream import Query, deploy, run_reference, seconds
from replistream.errors import QueryError
from replistream.schema import END
from replistream.testing import Call, assert_same_output, inject_at

pytestmark = pytest.mark.usefixtures("ray_session")

SERVERS = ["boston", "london", "tokyo"]


def query() -> Query:
    q = Query("remove_then_add")
    s = q.source("s", {"k": "i8", "x": "f8"}, punctuate_every=seconds(0.5))
    m = s.filter(lambda t: t["x"] > 0.2, name="hot").map(lambda t: {"k": t["k"], "x": t["x"] * 2},
                                                           {"k": "i8", "x": "f8"}, name="m")
    m.window(size=seconds(2), by="k", aggs={"n": "count", "s": ("x", "sum")}, name="per_k").sink("sums")
    return q.build()


def inputs(n=400, seed=7) -> dict:
    rng = np.random.default_rng(seed)
    ts = np.arange(n, dtype=np.int64) * seconds(0.05)
    return {"s": [{"ts": ts[i:i + 10], "k": rng.integers(0, 12, 10), "x": rng.random(10)} for i in range(0, n, 10)]}


def counting(name: str, app: str):
    """What add_operator builds on m's stream: a count per key and second, into ``app``."""
    return lambda st: st.window(size=seconds(1), by="k", aggs={"n": "count"}, name=name).sink(app)


def _until_ended(app: str, seen: list):
    """A call in the feed that holds it until ``app`` got the end of the stream (fetched by
    ``poll()``), so that every application there is has ended while the feed still runs."""
    def hold(d):
        deadline = time.time() + 120
        while d.delivered.punctuation[app] != END and time.time() < deadline:
            d.poll(wait_s=0.1)
        seen.append(d.delivered.punctuation[app] == END)
    return Call(hold)


def _refused(recs: list, fn):
    """A call in the feed recording the error ``fn(dep)`` raises (None: it did not raise)."""
    def call(d):
        try:
            fn(d)
            recs.append(None)
        except QueryError as e:
            recs.append(str(e))
    return Call(call)


def _check(dep, data, res) -> dict:
    assert res.complete, res.punctuation
    ref = run_reference(dep.query, data)
    for app in dep.query.sinks:
        assert_same_output(ref.outputs[app], res.outputs[app])
    return {app: len(ref.outputs[app]) for app in dep.query.sinks}


@pytest.mark.slow
def test_remove_then_add_a_new_application_after_the_removed_one_ended():
    """k=2: per_k removed at 5 s; once its application got the end, adding a node under a removed
    name (the operator's, or the application's) is refused naming it; at 12 s an operator and
    application with new names are added: both applications exact, run() complete."""
    data, recs, ended, refusals = inputs(), [], [], []
    s = inject_at(data["s"], seconds(5), Call(lambda d: recs.append(d.remove_operator("per_k"))))
    s = inject_at(s, seconds(8), _until_ended("sums", ended),
                  _refused(refusals, lambda d: d.add_operator("m", counting("per_k", "counts"))),
                  _refused(refusals, lambda d: d.add_operator("m", counting("per_k1", "sums"))))
    s = inject_at(s, seconds(12), Call(lambda d: recs.append(d.add_operator("m", counting("per_k1", "counts")))))
    with deploy(query(), servers=SERVERS, k=2, network="zero") as dep:
        res = dep.run({"s": s}, pace=None, timeout=180)
        assert ended == [True]
        sizes = _check(dep, data, res)
        assert [r["change"] for r in recs] == ["remove_operator", "add_operator"]
        assert [c["change"] for c in dep.changes] == ["remove_operator", "add_operator"]  # the refusals changed nothing
        assert recs[1]["added"] == ["per_k1", "counts"]
        assert len(refusals) == 2 and "'per_k' already exists" in refusals[0] and "'sums' already exists" in refusals[1]
        assert sizes["counts"] > 0 and len(res.outputs["counts"]) == sizes["counts"]
        assert sizes["sums"] < len(run_reference(query(), data).outputs["sums"])  # the removal did something
        assert dep.delivered.fetched["counts"] == sizes["counts"]  # fetched once each, not more


@pytest.mark.slow
def test_remove_then_add_with_results_polled_midway():
    """k=2: the same order, with the results fetched by poll() in the middle of the feed (after the
    addition, while the added application runs): what each poll fetched only grows, and run() ends
    with every tuple of both applications, exact."""
    data, recs, ended, counts = inputs(500, seed=11), [], [], []
    s = inject_at(data["s"], seconds(4), Call(lambda d: recs.append(d.remove_operator("per_k"))))
    s = inject_at(s, seconds(7), _until_ended("sums", ended))
    s = inject_at(s, seconds(9), Call(lambda d: recs.append(d.add_operator("m", counting("per_k2", "counts2")))))
    s = inject_at(s, seconds(10), Call(lambda d: counts.append(d.delivered.count("counts2"))))
    for t in (12, 16, 20, 24):
        s = inject_at(s, seconds(t), Call(lambda d: (d.poll(), counts.append(d.delivered.count("counts2")))))
    with deploy(query(), servers=SERVERS, k=2, network="zero") as dep:
        res = dep.run({"s": s}, pace=None, timeout=180)
        assert ended == [True]
        sizes = _check(dep, data, res)
        assert [r["change"] for r in recs] == ["remove_operator", "add_operator"]
        assert len(counts) == 5 and counts == sorted(counts) and counts[-1] <= sizes["counts2"]
        assert len(res.outputs["counts2"]) == sizes["counts2"] > 0


@pytest.mark.slow
def test_a_feed_that_has_not_ended_is_not_a_complete_run():
    """k=2: per_k removed, its application got the end, and the feed is then held (on an event the
    test sets afterwards): every application there is has ended, but a change still to come could
    add one, so run() does not return as complete; it raises at its timeout, saying the feed has
    not ended."""
    from replistream.errors import RunFailed
    import threading

    data, ended, release = inputs(), [], threading.Event()
    s = inject_at(data["s"], seconds(5), Call(lambda d: d.remove_operator("per_k")))
    s = inject_at(s, seconds(8), _until_ended("sums", ended), Call(lambda d: release.wait(120)))
    with deploy(query(), servers=SERVERS, k=2, network="zero") as dep:
        try:
            with pytest.raises(RunFailed, match="every application received the end of the stream but the feed "
                                                "had not ended"):
                dep.run({"s": s}, pace=None, timeout=12)
        finally:
            release.set()
        assert ended == [True]

"""The query builder (replistream.query) and the reference engine (replistream.engines.run_reference)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from replistream import END, Punctuation, Query, Schema, Summary, run_reference
from replistream.replica import ReplicaCore
from replistream.errors import QueryError, SchemaError
from replistream.operators import OperatorLogic
from replistream.operators.join import JoinLogic
from replistream.operators.sorter import canonical_order


class Recorder(OperatorLogic):
    """A custom operator that passes tuples through and records the order it saw them in."""

    order_sensitive = True

    def __init__(self, name, in_schemas, strict=False):
        super().__init__(name, in_schemas, in_schemas[0], strict)
        self.seen = []

    def _on_batch(self, port, batch):
        self.seen.extend(zip(batch["ts"].tolist(), batch["id"].tolist()))
        return [batch]


def one_source(q):
    return q.source("a", {"k": "i8", "v": "f8"}, punctuate_every=10)


def two_sources(q):
    a = q.source("a", {"k": "i8", "v": "f8"}, punctuate_every=10)
    b = q.source("b", {"k": "i8", "w": "i8"}, punctuate_every=10)
    return a, b


# -- validation -------------------------------------------------------------------

def test_union_schema_mismatch_named():
    q = Query("u")
    a, b = two_sources(q)
    with pytest.raises(SchemaError, match="union 'both'.*input 1"):
        a.union(b, name="both").sink("out")
        q.build()


def test_join_of_wrong_arity_via_apply():
    q = Query("j")
    a = one_source(q)
    a.apply(lambda name, ins, strict: JoinLogic(name, ins, window=5), name="myjoin").sink("out")
    with pytest.raises(ValueError, match="join 'myjoin' takes exactly 2 inputs, got 1"):
        q.build()
    q = Query("j3")
    a, b = two_sources(q)
    c = q.source("c", {"k": "i8"})
    a.apply(lambda name, ins, strict: JoinLogic(name, ins, window=5), b, c, name="j3").sink("out")
    with pytest.raises(ValueError, match="exactly 2 inputs, got 3"):
        q.build()


@pytest.mark.parametrize("method", ["window", "count_window"])
@pytest.mark.parametrize("size, slide, word", [(0, None, "size"), (-10, None, "size"), (10, 0, "slide"),
                                               (10, -1, "slide")])
def test_window_parameters(method, size, slide, word):
    q = Query()
    a = one_source(q)
    with pytest.raises(ValueError, match=f"'w'.*{word} must be > 0"):
        getattr(a, method)(size=size, slide=slide, name="w").sink("out")
        q.build()


def test_join_window_must_be_positive():
    q = Query()
    a, b = two_sources(q)
    with pytest.raises(ValueError, match="window must be > 0"):
        a.join(b, window=0, on="k", name="j").sink("out")
        q.build()


def test_unknown_group_field():
    q = Query()
    a = one_source(q)
    with pytest.raises(QueryError, match=r"by='host'\) named 'w': 'host' is not a field of its input"):
        a.window(size=10, by="host", name="w").sink("out")
        q.build()


def test_aggregation_on_non_numeric_field():
    q = Query()
    a = q.source("a", {"host": "U8", "v": "f8"})
    with pytest.raises(QueryError, match="numeric.*'host'"):
        a.window(size=10, aggs={"s": ("host", "sum")}, name="w").sink("out")
        q.build()


def test_dangling_operator_without_sink():
    q = Query()
    a = one_source(q)
    a.filter(lambda x: x["v"] > 0, name="lonely")
    a.sink("out")
    with pytest.raises(QueryError, match="'lonely' feeds no application"):
        q.build()


def test_unused_source_is_dangling_too():
    q = Query()
    a, b = two_sources(q)
    a.sink("out")
    with pytest.raises(QueryError, match="'b' feeds no application"):
        q.build()


def test_duplicate_node_names():
    q = Query("dup")
    a = one_source(q)
    a.filter(lambda x: x["v"] > 0, name="f")
    with pytest.raises(QueryError, match="'f' already exists"):
        a.map(lambda x: {"k": x["k"], "v": x["v"]}, name="f")
    with pytest.raises(QueryError, match="'a' already exists"):
        q.source("a", {"x": "i8"})
    with pytest.raises(QueryError, match="'f' already exists"):
        a.sink("f")


def test_no_source_no_sink():
    with pytest.raises(QueryError, match="no source"):
        Query("empty").build()
    q = Query("nosink")
    q.source("a", {"x": "i8"})
    with pytest.raises(QueryError, match="no application"):
        q.build()


def test_cannot_read_from_application_or_other_query():
    q = Query()
    a = one_source(q)
    name = a.sink("out")
    assert name == "out"
    other = Query("other")
    o = other.source("o", {"k": "i8", "v": "f8"})
    with pytest.raises(QueryError, match="another query"):
        a.union(o)
    with pytest.raises(QueryError, match="inputs must be Streams"):
        q.union(a, "out")


def test_custom_factory_must_return_operator_logic():
    q = Query()
    a = one_source(q)
    a.apply(lambda name, ins, strict: object(), name="bad").sink("out")
    with pytest.raises(QueryError, match="'bad'.*OperatorLogic"):
        q.build()


def test_source_parameters_validated():
    q = Query()
    with pytest.raises(ValueError, match="punctuate_every"):
        q.source("a", {"x": "i8"}, punctuate_every=0)
    with pytest.raises(ValueError, match="max_disorder"):
        q.source("b", {"x": "i8"}, max_disorder=-1)
    with pytest.raises(SchemaError, match="reserved"):
        q.source("c", {"ts": "i8"})


def test_unknown_source_in_inputs_to_run_reference():
    q = Query("q")
    s = q.source("s", {"x": "i8"})
    s.sink("out")
    with pytest.raises(QueryError, match=r"unknown source\(s\) \['typo'\]"):
        run_reference(q.build(), {"typo": [{"ts": 1, "x": 1}]})


def test_query_is_validated_again_after_changes():
    q = Query()
    s = q.source("s", {"x": "i8"})
    s.sink("out")
    q.build()
    s.filter(lambda b: b["x"] > 0, name="later")
    with pytest.raises(QueryError, match="'later'"):
        q.build()


# -- describe / sorters / schemas -----------------------------------------------------

def build_mixed():
    q = Query("mixed")
    a, b = two_sources(q)
    j = a.join(b, window=10, on="k", name="j")
    j.window(size=10, by="k_l", aggs={"n": "count"}, name="tw").sink("counts")
    j.count_window(size=3, aggs={"s": ("w", "sum")}, name="cw").sink("sums", ordered=True)
    a.apply(Recorder, order_sensitive=True, name="rec").sink("recorded")
    a.filter(lambda x: x["v"] > 0, name="pos").sink("positive")
    return q.build()


def test_sorters_only_where_needed():
    q = build_mixed()
    assert q.sorters == ["rec", "sums"]
    for n in ("j", "tw", "cw", "pos", "counts", "positive"):
        assert not q.sorted_inputs(n)
    assert q.sorted_inputs("recorded") is False
    assert q.sources == ["a", "b"]
    assert set(q.sinks) == {"counts", "sums", "recorded", "positive"}
    assert set(q.operators) == {"j", "tw", "cw", "rec", "pos"}


def test_describe():
    q = build_mixed()
    text = q.describe()
    lines = text.splitlines()
    assert lines[0] == "query 'mixed': 2 source(s), 5 operator(s), 4 application(s)"
    assert len(lines) == 1 + 11
    by_node = {ln.split()[1]: ln for ln in lines[1:]}
    assert "JoinSpec" in by_node["j"] and "<- a, b" in by_node["j"]
    assert "[sorted inputs]" in by_node["rec"] and "[sorted inputs]" in by_node["sums"]
    assert "[sorted inputs]" not in by_node["cw"] and "[sorted inputs]" not in by_node["counts"]
    assert by_node["a"].split()[0] == "source" and "<- -" in by_node["a"]
    assert by_node["sums"].split()[0] == "sink"


def test_schemas_propagate():
    q = build_mixed()
    assert q.schema_of("j").names == ("k_l", "v", "k_r", "w")
    assert q.schema_of("tw").names == ("k_l", "window_start", "window_end", "n")
    assert q.schema_of("cw").names == ("window", "first_ts", "last_ts", "s")
    assert q.schema_of("sums") == q.schema_of("cw")
    assert q.inputs_of("j") == ["a", "b"]
    assert ("j", 1) in q.outputs_of("b")


def test_map_schema_default_and_explicit():
    q = Query()
    s = q.source("s", {"x": "i8"})
    m1 = s.map(lambda b: {"x": b["x"] + 1})
    m2 = s.map(lambda b: {"y": b["x"] * 0.5}, {"y": "f8"})
    assert m1.schema == Schema({"x": "i8"}) and m2.schema == Schema({"y": "f8"})


def test_specs_pickle():
    q = Query()
    s = q.source("s", {"x": "i8"}, punctuate_every=5)
    s.window(size=10, slide=5, aggs={"n": "count", "s": ("x", "sum")}, name="w").sink("out")
    q.build()
    for n in ("s", "w", "out"):
        spec = pickle.loads(pickle.dumps(q.spec(n)))
        assert spec == q.spec(n)


# -- run_reference ------------------------------------------------------------------------

def test_run_reference_end_to_end():
    q = Query("e2e")
    a = q.source("load", {"server": "i8", "cpu": "f8"}, punctuate_every=10)
    p = q.source("ping", {"src": "i8", "ms": "f8"}, punctuate_every=10)
    hot = a.join(p, window=5, left_key="server", right_key="src", name="j").filter(lambda b: b["cpu"] > 0.5,
                                                                                  name="hot")
    hot.sink("alerts", ordered=True)
    a.window(size=10, by="server", aggs={"n": "count", "avg": ("cpu", "mean"),
                                         "spread": ("cpu", Summary(lambda v: v.max() - v.min()))},
             name="per_server").sink("stats")
    load = [{"ts": 1, "server": 1, "cpu": 0.9}, {"ts": 3, "server": 2, "cpu": 0.2},
            {"ts": 12, "server": 1, "cpu": 0.7}, {"ts": 14, "server": 1, "cpu": 0.1}]
    ping = [{"ts": 2, "src": 1, "ms": 10.0}, {"ts": 4, "src": 2, "ms": 20.0}, {"ts": 15, "src": 1, "ms": 30.0}]
    r = run_reference(q.build(), {"load": load, "ping": ping})
    assert r.complete and r.punctuation == {"alerts": END, "stats": END}
    assert r.dead_letters == [] and r.dead_letter_count() == 0
    alerts = r.outputs["alerts"]
    # (1, 0.9) x (2, 10.0) -> ts 2; (12, 0.7) x (15, 30.0) -> ts 15; server 2 is not hot; 14 has cpu 0.1
    assert alerts[["ts", "server", "cpu", "src", "ms"]].tolist() == [(2, 1, 0.9, 1, 10.0), (15, 1, 0.7, 1, 30.0)]
    assert alerts.tobytes() == alerts[canonical_order(alerts)].tobytes()
    stats = r.outputs["stats"]
    got = sorted(stats[["window_start", "server", "n", "avg", "spread"]].tolist())
    assert got == [(0, 1, 1, 0.9, 0.0), (0, 2, 1, 0.2, 0.0), (10, 1, 2, (0.7 + 0.1) / 2, 0.7 - 0.1)]
    assert r.stats["entries"]["load"]["tuples_out"] == 4


def test_run_reference_ordered_sink_and_sorted_custom_operator():
    q = Query()
    a = q.source("a", {"x": "i8"}, max_disorder=50, punctuate_every=10)
    b = q.source("b", {"x": "i8"}, max_disorder=50, punctuate_every=10)
    a.union(b, name="u").sink("ordered", ordered=True)
    rng = np.random.default_rng(0)
    ra = [{"ts": int(t), "x": 0} for t in rng.permutation(40)]
    rb = [{"ts": int(t), "x": 1} for t in rng.permutation(40)]
    r = run_reference(q.build(), {"a": [ra[:20], ra[20:]], "b": rb})
    out = r.outputs["ordered"]
    assert len(out) == 80
    assert out.tobytes() == out[canonical_order(out)].tobytes()


def test_replica_core_sorts_inputs_of_order_sensitive_custom_operator():
    q = Query()
    s = q.source("s", {"x": "i8"})
    s.apply(Recorder, order_sensitive=True, name="rec").sink("out")
    q.build()
    core = ReplicaCore(q, "rec", channels=[2])
    sch = q.schema_of("s")
    b1 = sch.from_columns({"ts": [5, 1, 3], "x": [0, 0, 0]}, ids=[30, 10, 20])
    b2 = sch.from_columns({"ts": [3, 2], "x": [0, 0]}, ids=[15, 40])
    assert core.process(0, 1, b1) == []          # buffered by the sorter
    assert core.process(0, 0, b2) == []
    assert core.process(0, 0, b1) == []          # duplicate copy from the other replica
    out = core.process(0, 0, Punctuation(3))
    assert core.logic.seen == [(1, 10), (2, 40), (3, 15), (3, 20)]
    assert out[-1] == Punctuation(3)
    out = core.process(0, 1, Punctuation(END))
    assert core.logic.seen[-1] == (5, 30)


def test_run_reference_reports_late_tuples():
    q = Query()
    s = q.source("s", {"x": "i8"}, punctuate_every=10)
    s.sink("out")
    r = run_reference(q.build(), {"s": [[{"ts": 25, "x": 0}], [{"ts": 3, "x": 1}, {"ts": 30, "x": 2}]]})
    assert r.outputs["out"]["x"].tolist() == [0, 2]
    assert r.dead_letter_count() == 1
    assert r.dead_letters[0].where == "source 's'"

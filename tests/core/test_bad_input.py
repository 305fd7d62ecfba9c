"""Bad input gives a clear error naming the thing at fault (field, parameter, port), or is dead-lettered."""
from __future__ import annotations

import numpy as np
import pytest

from replistream import PunctuationViolation, Query, QueryError, Schema, SchemaError, run_reference
from replistream.replica import ReplicaCore
from replistream.operators import FilterLogic
from replistream.operators.aggregate import CountWindowAggregateLogic, TimeWindowAggregateLogic
from replistream.operators.join import JoinLogic
from replistream.schema import Punctuation
from replistream.testing import run_replicated

S = Schema({"host": "U8", "cpu": "f8"})


def raw(**fields):
    """A structured array with exactly the given (name, dtype, values) fields."""
    n = len(next(iter(fields.values()))[1])
    b = np.zeros(n, dtype=[(k, v[0]) for k, v in fields.items()])
    for k, (_, vals) in fields.items():
        b[k] = vals
    return b


def simple_query(**src):
    q = Query("bad")
    s = q.source("load", {"host": "U8", "cpu": "f8"}, **src)
    s.filter(lambda b: b["cpu"] >= 0, name="f").sink("out")
    return q.build()


# -- malformed batches -------------------------------------------------------------------

@pytest.mark.parametrize("batch, field", [
    (raw(ts=("i8", [1]), id=("u8", [1]), host=("U8", ["a"])), "cpu"),                        # missing field
    (raw(ts=("i8", [1]), id=("u8", [1]), host=("U8", ["a"]), cpu=("U4", ["hi"])), "cpu"),   # wrong dtype
    (raw(ts=("f8", [1.5]), id=("u8", [1]), host=("U8", ["a"]), cpu=("f8", [0.5])), "ts"),   # float ts
    (raw(id=("u8", [1]), host=("U8", ["a"]), cpu=("f8", [0.5])), "ts"),                      # no ts
    (raw(ts=("i8", [1]), host=("U8", ["a"]), cpu=("f8", [0.5])), "id"),                      # no id
])
def test_operator_rejects_malformed_batch_naming_field(batch, field):
    op = FilterLogic("hot", [S], lambda b: b["cpu"] > 0.5)
    with pytest.raises(SchemaError, match=f"hot input 0.*'{field}'"):
        op.process(0, batch)


@pytest.mark.parametrize("records, field", [
    ([{"ts": 1, "host": "a"}], "cpu"),
    ([{"ts": 1, "host": "a", "cpu": "high"}], "cpu"),
    ([{"ts": 1, "host": 7, "cpu": 0.5}], "host"),
    ([{"ts": float("nan"), "host": "a", "cpu": 0.5}], "ts"),
    ([{"ts": 2.5, "host": "a", "cpu": 0.5}], "ts"),
    ([{"ts": "yesterday", "host": "a", "cpu": 0.5}], "ts"),
    ([{"host": "a", "cpu": 0.5}], "ts"),
    ([{"ts": 1, "host": "a", "cpu": 0.5, "mem": 3}], "mem"),
])
def test_run_reference_rejects_malformed_records_naming_field(records, field):
    q = simple_query()
    with pytest.raises(SchemaError, match=f"source 'load'.*'{field}'"):
        run_reference(q, {"load": records}, on_malformed="raise")
    r = run_reference(q, {"load": records})  # the default, as on every engine: set aside, with the same text
    assert r.complete and len(r.outputs["out"]) == 0
    assert [(d.where, d.count) for d in r.dead_letters] == [("source 'load'", 1)]
    assert r.dead_letters[0].reason.startswith("malformed: source 'load'") and f"'{field}'" in r.dead_letters[0].reason


@pytest.mark.parametrize("cols, field", [
    ({"ts": np.array([1.0, np.nan]), "host": ["a", "b"], "cpu": [0.1, 0.2]}, "ts"),
    ({"ts": np.array([1.0, 2.25]), "host": ["a", "b"], "cpu": [0.1, 0.2]}, "ts"),
    ({"ts": [1, 2], "host": ["a", "b"], "cpu": ["x", "y"]}, "cpu"),
    ({"ts": [1, 2], "host": ["a", "b"]}, "cpu"),
])
def test_run_reference_rejects_malformed_columns_naming_field(cols, field):
    with pytest.raises(SchemaError, match=f"'{field}'"):
        run_reference(simple_query(), {"load": cols}, on_malformed="raise")


def test_dead_letter_mode_keeps_the_query_running():
    q = simple_query(punctuate_every=10)
    recs = [{"ts": 1, "host": "a", "cpu": 0.5}, {"ts": 2, "host": "b", "cpu": "high"},
            {"ts": 3.5, "host": "c", "cpu": 0.1}, {"ts": 4, "host": "d", "cpu": 0.9}]
    r = run_reference(q, {"load": recs}, on_malformed="dead_letter")
    assert r.complete
    assert r.outputs["out"]["host"].tolist() == ["a", "d"]
    assert r.dead_letter_count() == 2
    assert all("malformed" in d.reason for d in r.dead_letters)


# -- invalid parameters -------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, -1])
def test_run_replicated_k_below_one(k):
    with pytest.raises(ValueError, match=r"k \(the degree of replication\) must be >= 1, got " + str(k)):
        run_replicated(simple_query(), {"load": []}, k=k)


def test_run_replicated_k_one_works():
    r = run_replicated(simple_query(punctuate_every=5), {"load": [{"ts": 1, "host": "a", "cpu": 0.5}]}, k=1, seed=3)
    assert r.complete and r.outputs["out"]["host"].tolist() == ["a"]


@pytest.mark.parametrize("make, word", [
    (lambda: TimeWindowAggregateLogic("w", [S], size=0), "size must be > 0, got 0"),
    (lambda: TimeWindowAggregateLogic("w", [S], size=10, slide=-2), "slide must be > 0, got -2"),
    (lambda: CountWindowAggregateLogic("w", [S], size=-1), "size must be > 0, got -1"),
    (lambda: CountWindowAggregateLogic("w", [S], size=3, slide=0), "slide must be > 0, got 0"),
    (lambda: JoinLogic("w", [S, S], window=0), "window must be > 0, got 0"),
])
def test_window_parameters_rejected(make, word):
    with pytest.raises(ValueError, match=word) as ei:
        make()
    assert "'w'" in str(ei.value)


@pytest.mark.parametrize("method", ["window", "count_window"])
def test_query_window_parameters_rejected(method):
    q = Query()
    s = q.source("s", {"x": "i8"})
    getattr(s, method)(size=10, slide=0, name="agg").sink("out")
    with pytest.raises(ValueError, match="'agg'.*slide must be > 0"):
        run_reference(q, {"s": []})


@pytest.mark.parametrize("port", [1, 2, -1])
def test_operator_unknown_input_port(port):
    op = FilterLogic("f", [S], lambda b: b["cpu"] > 0)
    with pytest.raises(ValueError, match=f"operator 'f' has 1 input\\(s\\); got input {port}"):
        op.process(port, Punctuation(3))
    with pytest.raises(ValueError, match="got input"):
        op.process(port, S.empty(1))


def test_join_unknown_input_port():
    j = JoinLogic("j", [S, S], window=5)
    with pytest.raises(ValueError, match="'j' has 2 input"):
        j.process(2, Punctuation(1))


def test_reference_replica_core_unknown_port():
    q = simple_query()
    core = ReplicaCore(q, "f", channels=None)
    with pytest.raises(ValueError, match="'f'.*got input 1"):
        core.process(1, 0, Punctuation(3))


def test_replicated_core_unknown_port():
    q = simple_query()
    core = ReplicaCore(q, "f", channels=[2])
    with pytest.raises(ValueError, match="'f'"):
        core.process(1, 0, Punctuation(3))


def test_replica_core_channel_count_mismatch():
    q = simple_query()
    with pytest.raises(ValueError, match="'f' has 1 input"):
        ReplicaCore(q, "f", channels=[2, 2])


def test_unknown_source_name():
    with pytest.raises(QueryError, match="unknown source"):
        run_reference(simple_query(), {"laod": []})


# -- late tuples ---------------------------------------------------------------------------------

LATE_INPUT = [[{"ts": 30, "host": "a", "cpu": 0.5}],
              [{"ts": 12, "host": "late", "cpu": 0.5}, {"ts": 31, "host": "b", "cpu": 0.5}],
              [{"ts": 19, "host": "late2", "cpu": 0.5}, {"ts": 40, "host": "c", "cpu": 0.5}]]


def test_late_tuples_counted_and_dead_lettered():
    r = run_reference(simple_query(punctuate_every=10), {"load": LATE_INPUT})
    assert r.outputs["out"]["host"].tolist() == ["a", "b", "c"]
    assert r.dead_letter_count() == 2
    assert r.stats["entries"]["load"]["late"] == 2
    dead = np.concatenate([d.batch for d in r.dead_letters])
    assert sorted(dead["host"].tolist()) == ["late", "late2"]
    assert all(d.where == "source 'load'" and "late" in d.reason for d in r.dead_letters)


def test_late_tuples_same_in_replicated_run():
    r = run_replicated(simple_query(punctuate_every=10), {"load": LATE_INPUT}, k=3, seed=7)
    assert sorted(r.outputs["out"]["host"].tolist()) == ["a", "b", "c"]
    assert r.dead_letter_count() == 2


def test_strict_mode_raises_on_late_tuple():
    with pytest.raises(PunctuationViolation, match="source 'load'.*ts=12"):
        run_reference(simple_query(punctuate_every=10), {"load": LATE_INPUT}, strict=True)


def test_operator_late_tuple_dead_lettered_or_strict():
    op = FilterLogic("f", [S], lambda b: b["cpu"] > 0)
    op.process(0, Punctuation(10))
    b = S.from_columns({"ts": [10, 11], "host": ["x", "y"], "cpu": [1.0, 1.0]}, ids=[1, 2])
    out = op.process(0, b)
    assert out[0]["host"].tolist() == ["y"]
    assert op.late_count == 1 and op.stats()["late"] == 1
    assert op.dead_letters[0].where == "f input 0" and "punctuation 10" in op.dead_letters[0].reason
    strict = FilterLogic("f", [S], lambda b: b["cpu"] > 0, strict=True)
    strict.process(0, Punctuation(10))
    with pytest.raises(PunctuationViolation, match="f input 0: tuple with ts=10 arrived after punctuation 10"):
        strict.process(0, b)

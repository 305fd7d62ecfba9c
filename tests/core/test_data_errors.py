"""Issue #15, the data side: user functions that raise, wrong results, unparseable records and misused
names end either in dead letters naming the operator and the reason (nothing lost, nothing folded
into results) or in an error naming what is wrong, identically in the reference, in-process and
simulated runs (docs/reliability.md)."""
from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest

from replistream import Query, QueryError, SchemaError, UserFunctionError, seconds
from replistream.network import ZeroLatency, default_servers
from replistream.network.servers import Server
from replistream.operators import FilterLogic
from replistream.operators.base import isolate_failures
from replistream.operators.entry import EntryLogic
from replistream.scenario import Scenario
from replistream.schema import END, Schema
from replistream.testing import run_reference, run_replicated

S = Schema({"k": "i8", "v": "f8"})


def pick(b):
    """Keeps v > 0; raises on rows with k == 3 (a row-wise failure: the same rows whatever the batch)."""
    if (b["k"] == 3).any():
        raise ValueError("k is 3")
    return b["v"] > 0


def inputs(n=400, chunk=9, seed=2):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(40), n))
    k, v = rng.integers(0, 8, n), rng.normal(size=n)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, n, chunk)]}


def filter_query(on_error=None, query_on_error="dead_letter"):
    q = Query("bad", on_error=query_on_error)
    q.source("s", {"k": "i8", "v": "f8"},
             punctuate_every=seconds(1)).filter(pick, name="pick", on_error=on_error).sink("out")
    return q.build()


def raised(result) -> Counter:
    return Counter((d.where, d.reason, int(i)) for d in result.dead_letters if " raised " in d.reason
                   for i in d.batch["id"])


# -- user functions that raise -------------------------------------------------------------------

def test_rows_a_predicate_raises_on_are_dead_lettered_whatever_the_batching():
    q = filter_query()
    runs = [run_reference(q, inputs(chunk=c)) for c in (1, 9, 400)]
    data = inputs(chunk=400)["s"][0]
    bad = int((data["k"] == 3).sum())
    assert bad > 0
    for r in runs:
        assert r.complete
        assert sum(raised(r).values()) == bad
        assert {reason for _, reason, _ in raised(r)} == {"predicate raised ValueError: k is 3"}
        assert len(r.outputs["out"]) == int(((data["k"] != 3) & (data["v"] > 0)).sum())
        assert not (r.outputs["out"]["k"] == 3).any()
    assert raised(runs[0]) == raised(runs[1]) == raised(runs[2])


def test_replicas_dead_letter_the_same_rows_once_each_in_process_and_in_the_simulator():
    from replistream.sim import Simulator

    q = filter_query()
    ref = run_reference(q, inputs())
    rep = run_replicated(q, inputs(), k=3, seed=4)
    servers = [s.name for s in default_servers(3)]
    sim = Simulator(q, {"entry": servers, "pick": servers, "out": servers[:1]}, ZeroLatency(servers)).run(inputs())
    for r in (rep, sim):
        assert raised(r) == raised(ref)
        assert Counter(map(tuple, r.outputs["out"].tolist())) == Counter(map(tuple, ref.outputs["out"].tolist()))


def test_on_error_fail_names_the_operator_and_a_row():
    with pytest.raises(UserFunctionError, match=r"operator 'pick': predicate raised ValueError: k is 3 \(on input row") as e:
        run_reference(filter_query(on_error="fail"), inputs())
    assert e.value.operator == "pick" and e.value.row[2] == 3 and isinstance(e.value.cause, ValueError)
    # the query's default, and an operator's own policy over it
    with pytest.raises(UserFunctionError):
        run_reference(filter_query(query_on_error="fail"), inputs())
    assert run_reference(filter_query(on_error="dead_letter", query_on_error="fail"), inputs()).complete
    with pytest.raises(UserFunctionError, match="'pick'"):
        run_reference(filter_query().with_on_error("fail"), inputs())
    with pytest.raises(UserFunctionError, match="'pick'"):
        run_replicated(filter_query(on_error="fail"), inputs(), k=2, seed=1)


def test_on_error_must_be_one_of_two():
    with pytest.raises(ValueError, match="on_error must be 'dead_letter' or 'fail', got 'skip'"):
        Query(on_error="skip")
    with pytest.raises(ValueError, match="on_error must be"):
        Query().source("s", {"x": "i8"}).filter(lambda b: b["x"] > 0, on_error="ignore")


@pytest.mark.parametrize("bad", [
    lambda b: np.ones(len(b) + 1, dtype=bool),  # wrong length
    lambda b: b["k"],                           # wrong type
    lambda b: None,                             # nothing
])
def test_a_wrong_result_is_an_error_naming_the_operator_under_either_policy(bad):
    for policy in ("dead_letter", "fail"):
        q = Query(on_error=policy)
        q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1)).filter(bad, name="broken").sink("out")
        with pytest.raises(UserFunctionError, match="operator 'broken': filter predicate must return a boolean array"):
            run_reference(q.build(), inputs())


def test_map_flat_map_and_join_predicate_dead_letter_what_raises():
    def double(b):
        if (b["k"] == 5).any():
            raise KeyError("five")
        return {"k": b["k"], "v": b["v"] * 2}

    def explode(b):
        if (b["k"] == 6).any():
            raise ZeroDivisionError("six")
        return np.arange(len(b)), {"k": b["k"], "v": b["v"]}

    def near(left, right):
        if (left["k"] == 2).any():
            raise RuntimeError("two")
        return np.abs(left["v"] - right["v"]) < 1.0

    q = Query("many")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    m = s.map(double, name="double").flat_map(explode, name="explode")
    m.join(s, window=seconds(1), on="k", predicate=near, name="pairs").sink("out")
    q.build()
    r = run_reference(q, inputs())
    reasons = Counter((d.where, d.reason) for d in r.dead_letters for _ in range(d.count))
    assert reasons[("double", "map function raised KeyError: 'five'")] > 0
    assert reasons[("explode", "flat_map function raised ZeroDivisionError: six")] > 0
    assert reasons[("pairs", "predicate raised RuntimeError: two")] > 0
    assert all(d.batch.dtype == q.schema_of("pairs").dtype for d in r.dead_letters if d.where == "pairs")
    out = r.outputs["out"]
    assert len(out) > 0 and not np.isin(out["k_l"], [2, 5, 6]).any()
    assert raised(run_replicated(q, inputs(), k=2, seed=3)) == raised(r)


def test_a_custom_operator_that_raises_is_an_error_naming_it():
    from replistream.operators import OperatorLogic

    class Boom(OperatorLogic):
        def _on_batch(self, port, batch):
            raise IndexError("out of range")

    q = Query()
    q.source("s", {"k": "i8", "v": "f8"}).apply(lambda n, s, strict: Boom(n, s, s[0], strict), name="boom").sink("o")
    with pytest.raises(UserFunctionError, match="operator 'boom': IndexError: out of range"):
        run_reference(q.build(), inputs())


def test_bisection_finds_every_failing_row_and_keeps_order():
    bad = {3, 4, 17, 63}

    def call(lo, hi):
        if bad & set(range(lo, hi)):
            raise ValueError
        return list(range(lo, hi))

    results, failures = isolate_failures(64, call)
    assert [i for i, _ in failures] == sorted(bad)
    assert [x for _, _, v in results for x in v] == [i for i in range(64) if i not in bad]
    assert [i for i, _ in isolate_failures(64, call, first_only=True)[1]] == [3]


def test_the_filter_logic_on_its_own_sets_rows_aside_with_the_operator_name():
    f = FilterLogic("f", [S], pick)
    out = f.process(0, S.from_columns({"ts": [1, 2, 3], "k": [3, 1, 3], "v": [1.0, 1.0, 1.0]}))
    assert out[0]["k"].tolist() == [1] and f.failed_count == 2 and f.dead_letters[0].where == "f"


# -- records the entry points cannot read --------------------------------------------------------

BAD_RECORDS = [
    ({"ts": 6, "k": [1, 2], "v": 1.0}, "field 'k' has 2 values"),
    ((7, 1, 1.0), "a record is a tuple, expected a mapping"),
    (None, "a record is a NoneType"),
    ({"ts": -10**30, "k": 1, "v": 1.0}, "beyond int64"),
    ({"ts": 2**63, "k": 1, "v": 1.0}, "beyond int64"),
    ({"ts": END, "k": 1, "v": 1.0}, "reserved for the end of the stream"),
    ({"ts": 8, "k": 2**64, "v": 1.0}, "field 'k'"),
    ({"ts": "9", "k": 1, "v": 1.0}, "field 'ts'"),
]


@pytest.mark.parametrize("record,reason", BAD_RECORDS, ids=[r for _, r in BAD_RECORDS])
def test_an_unreadable_record_is_dead_lettered_with_its_reason(record, reason):
    q = Query()
    q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=10).filter(lambda b: b["v"] > 0, name="f").sink("o")
    q.build()
    recs = [{"ts": t, "k": t, "v": 1.0} for t in range(1, 30)]
    recs[10] = record
    r = run_reference(q, {"s": recs}, on_malformed="dead_letter")
    assert r.complete and len(r.outputs["o"]) == 28
    assert [d.count for d in r.dead_letters] == [1]
    assert r.dead_letters[0].reason.startswith("malformed: ") and reason in r.dead_letters[0].reason
    with pytest.raises(SchemaError):  # and under the explicit "raise" policy, an error naming it (never OverflowError)
        run_reference(q, {"s": recs}, on_malformed="raise")
    default = run_reference(q, {"s": recs})  # the default policy is the dead letter, on every engine
    assert [(d.where, d.reason, d.count) for d in default.dead_letters] == \
        [(d.where, d.reason, d.count) for d in r.dead_letters]


def test_a_value_too_large_for_a_float32_field_is_malformed_not_infinity():
    e = EntryLogic("s", Schema({"f": "f4"}), on_malformed="dead_letter")
    out = e.push({"ts": np.array([1, 2]), "f": np.array([1e300, 2.0])})
    assert out[0]["f"].tolist() == [2.0] and "too large for float32" in e.dead_letters[0].reason
    assert np.isinf(EntryLogic("s", Schema({"f": "f4"})).push({"ts": [1], "f": [np.inf]})[0]["f"]).all()
    with pytest.raises(SchemaError, match="field 'f' holds 1e\\+300"):
        EntryLogic("s", Schema({"f": "f4"})).push({"ts": [1], "f": [1e300]})


def test_bad_rows_of_a_column_chunk_are_set_aside_one_by_one():
    e = EntryLogic("s", Schema({"x": "i8"}), on_malformed="dead_letter")
    out = e.push({"ts": np.array([1, END, 3]), "x": np.array([1, 2, 3])})
    assert out[0]["x"].tolist() == [1, 3] and e.malformed_count == 1
    assert e.seq == 3  # the bad row kept its sequence number: ids do not depend on which rows were bad


# -- names, files --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../escape", "a/b", "x y", "", "café", "a.b"])
def test_node_names_are_checked_when_the_query_is_built(name):
    q = Query()
    with pytest.raises(QueryError):
        q.source(name, {"x": "i8"})
    s = q.source("ok_1-a", {"x": "i8"})
    with pytest.raises(QueryError):
        s.sink(name)


def test_a_server_needs_both_coordinates_or_neither():
    with pytest.raises(ValueError, match="lat and lon must both be numbers or both nan"):
        Server("x", math.nan, 3.0)
    assert not Server("y", math.nan, math.nan).located


def test_a_server_file_refuses_nan_coordinates(tmp_path):
    from replistream.placement import load_servers

    p = tmp_path / "servers.csv"
    p.write_text("name,lat,lon\na,nan,4\nb,1,2\n")
    with pytest.raises(ValueError, match="lat must be a finite number"):
        load_servers(p)


def test_a_scenario_nested_too_deeply_is_a_clear_error(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text('{"events": ' + "[" * 50_000 + "]" * 50_000 + "}")
    with pytest.raises(ValueError, match="nested too deeply"):
        Scenario.from_file(p)
    json.loads('{"events": []}')

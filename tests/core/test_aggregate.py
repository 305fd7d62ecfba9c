"""Aggregates over time windows (Algorithm 3) and count windows (Algorithm 4), Hwang §IV-F,
against brute-force computations, under any batching, arrival order and punctuation spacing."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replistream.errors import PunctuationViolation, QueryError
from replistream.ids import hash_columns, mix, stable_hash
from replistream.operators.aggregate import (CountWindowAggregateLogic, Summary, TimeWindowAggregateLogic,
                                             normalize_aggs)
from replistream.operators.sorter import canonical_order
from replistream.schema import END, Punctuation, Schema

PROPS = settings(max_examples=50, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])

S = Schema({"g": "i8", "x": "f8", "i": "i8"})

FIRST = Summary(lambda v: v[0], "f8")                      # order sensitive: first value by (ts, id)
WEIGHTED = Summary(lambda rows: int(np.sum(rows["i"] * np.arange(1, len(rows) + 1))), "i8")

AGGS = {"n": "count", "s": ("x", "sum"), "lo": ("x", "min"), "hi": ("x", "max"), "avg": ("x", "mean"),
        "isum": ("i", "sum"), "imin": ("i", "min"), "imax": ("i", "max"), "iavg": ("i", "mean"),
        "first": ("x", FIRST), "w": ("*", WEIGHTED)}


def gen(rng: random.Random, n: int, t_lo=-30, t_hi=150, groups=3):
    """n records with unique ids; floats of wildly different magnitudes so float sums depend on order."""
    ts = [rng.randrange(t_lo, t_hi) for _ in range(n)]
    ids = rng.sample(range(1, 2**62), n)
    g = [rng.randrange(groups) for _ in range(n)]
    x = [rng.choice([-1.0, 1.0]) * rng.random() * 10.0 ** rng.randint(-20, 20) for _ in range(n)]
    for k in range(n):
        if rng.random() < 0.05:
            x[k] = -0.0
    i = [rng.randrange(-1000, 1000) for _ in range(n)]
    if n == 0:
        return S.empty()
    return S.from_columns({"ts": ts, "g": g, "x": x, "i": i}, ids=ids)


def deliveries(batch: np.ndarray, rng: random.Random, disorder: int, p_punct: float):
    """Items of a stream carrying ``batch``: shuffled within ``disorder``, random chunks, valid punctuations."""
    n = len(batch)
    order = sorted(range(n), key=lambda k: int(batch["ts"][k]) + rng.uniform(0, disorder))
    items, k = [], 0
    while k < n:
        m = rng.randint(1, 6)
        items.append(batch[order[k:k + m]])
        k += m
        rest = batch["ts"][order[k:]]
        if len(rest) and rng.random() < p_punct:
            items.append(Punctuation(int(rest.min()) - 1 - rng.randrange(0, 3)))
    items.append(Punctuation(END))
    return items


def run(op, items):
    out = []
    for it in items:
        out.extend(o for o in op.process(0, it) if not isinstance(o, Punctuation))
    res = np.concatenate(out) if out else op.out_schema.empty()
    return res[canonical_order(res)]


def summarize(rows: np.ndarray, aggs) -> dict:
    """Brute-force aggregations over ``rows`` (already in (ts, id) order)."""
    out = {}
    x = rows["x"].astype(np.float64) + 0.0
    for name, spec in aggs.items():
        if spec == "count":
            out[name] = len(rows)
            continue
        field, how = spec
        if isinstance(how, Summary):
            out[name] = how.fn(rows if field == "*" else rows[field])
        elif field == "x":
            out[name] = {"sum": math.fsum(x.tolist()), "min": x.min(), "max": x.max(),
                         "mean": math.fsum(x.tolist()) / len(rows)}[how]
        else:
            v = rows[field].tolist()
            out[name] = {"sum": sum(v), "min": min(v), "max": max(v), "mean": sum(v) / len(v)}[how]
    return out


def bits(v):
    return np.float64(v).tobytes() if isinstance(v, (float, np.floating)) else int(v)


# -- time windows: brute force --------------------------------------------------------

def brute_time(batch, size, slide, by, aggs):
    slide = size if slide is None else slide
    wins = {}
    for k in range(len(batch)):
        t = int(batch["ts"][k])
        first = -((-(t - size + 1)) // slide) * slide
        for start in range(first, t + 1, slide):
            key = tuple(batch[f][k].item() for f in by) + (start,)
            wins.setdefault(key, []).append(k)
    res = {}
    for key, idx in wins.items():
        rows = batch[np.array(idx)]
        rows = rows[canonical_order(rows)]
        res[key] = summarize(rows, aggs)
    return res


def as_dict(out, by, aggs):
    res = {}
    for row in out:
        key = tuple(row[f].item() for f in by) + (int(row["window_start"]),)
        assert key not in res, f"window {key} emitted twice"
        res[key] = {a: row[a].item() for a in aggs}
    return res


TIME_PARAMS = [(10, None), (10, 5), (10, 3), (7, 2), (4, 10), (1, 1), (3, 7), (6, 6)]


@PROPS
@given(st.sampled_from(TIME_PARAMS), st.sampled_from([(), ("g",)]), st.integers(0, 2**32), st.integers(0, 60))
def test_time_window_matches_brute_force(params, by, seed, n):
    size, slide = params
    rng = random.Random(seed)
    data = gen(rng, n)
    op = TimeWindowAggregateLogic("agg", [S], size=size, slide=slide, by=by, aggs=AGGS)
    out = run(op, deliveries(data, rng, disorder=rng.randrange(0, 20), p_punct=0.4))
    want = brute_time(data, size, slide, by, AGGS)
    got = as_dict(out, by, AGGS)
    assert set(got) == set(want)
    for key in want:
        for a in AGGS:
            assert bits(got[key][a]) == bits(want[key][a]), (key, a, got[key][a], want[key][a])
    # output columns
    assert (out["window_end"] - out["window_start"] == size).all()
    assert (out["ts"] == out["window_start"] + size - 1).all()
    assert (out["window_start"] % (slide or size) == 0).all()
    assert len(set(out["id"].tolist())) == len(out)
    assert op.open_windows == 0
    assert op.late_count == 0


@PROPS
@given(st.sampled_from(TIME_PARAMS), st.integers(0, 2**32), st.integers(1, 60))
def test_time_window_bit_identical_under_batching_and_order(params, seed, n):
    size, slide = params
    rng = random.Random(seed)
    data = gen(rng, n)
    outs = []
    for trial in range(3):
        r = random.Random(seed + 1000 * trial)
        op = TimeWindowAggregateLogic("agg", [S], size=size, slide=slide, by="g", aggs=AGGS)
        outs.append(run(op, deliveries(data, r, disorder=r.randrange(0, 40), p_punct=r.random())))
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()


@PROPS
@given(st.sampled_from(TIME_PARAMS), st.integers(0, 2**32), st.integers(1, 40))
def test_time_windows_close_only_at_punctuation(params, seed, n):
    size, slide = params
    rng = random.Random(seed)
    data = gen(rng, n, t_lo=0, t_hi=80)
    want = brute_time(data, size, slide, ("g",), {"n": "count"})
    op = TimeWindowAggregateLogic("agg", [S], size=size, slide=slide, by="g", aggs={"n": "count"})
    emitted, p = set(), -2**63
    for it in deliveries(data, rng, disorder=10, p_punct=0.5):
        out = op.process(0, it)
        if not isinstance(it, Punctuation):
            assert out == []  # Algorithm 3 is blocking: nothing closes on a tuple
            continue
        for b in out:
            if isinstance(b, Punctuation):
                continue
            for row in b:
                emitted.add((int(row["g"]), int(row["window_start"])))
        if it.p > p:
            p = it.p
            assert out[-1] == Punctuation(p)
        else:
            assert out == []  # a weaker or repeated promise closes nothing
        # exactly the windows whose last timestamp start + size - 1 <= p
        assert emitted == {k for k in want if k[1] + size - 1 <= p}


def test_time_window_docstring_example_and_boundaries():
    s = Schema({"k": "i8", "x": "f8"})
    a = TimeWindowAggregateLogic("a", [s], size=10, by="k", aggs={"n": "count", "m": ("x", "mean")})
    a.process(0, s.from_columns({"ts": [1, 5, 12], "k": [1, 1, 1], "x": [1.0, 2.0, 9.0]}, ids=[1, 2, 3]))
    assert a.process(0, Punctuation(8)) == [Punctuation(8)]  # window [0, 10) ends at 9 > 8
    out = a.process(0, Punctuation(9))
    assert out[0][["ts", "k", "window_start", "window_end", "n", "m"]].tolist() == [(9, 1, 0, 10, 2, 1.5)]
    assert a.open_windows == 1
    out = a.process(0, Punctuation(19))
    assert out[0][["ts", "window_start", "n", "m"]].tolist() == [(19, 10, 1, 9.0)]
    assert a.open_windows == 0


def test_sliding_window_membership_paper_example():
    # Hwang §IV-F: w = 10 s, s = 5 s: t = 43 belongs to [35, 45) and [40, 50)
    s = Schema({"x": "i8"})
    a = TimeWindowAggregateLogic("a", [s], size=10, slide=5, aggs={"n": "count"})
    a.process(0, s.from_columns({"ts": [43], "x": [0]}, ids=[1]))
    out = a.process(0, Punctuation(END))[0]
    assert out[["window_start", "window_end"]].tolist() == [(35, 45), (40, 50)]


def test_slide_greater_than_size_leaves_gaps():
    s = Schema({"x": "i8"})
    a = TimeWindowAggregateLogic("a", [s], size=3, slide=10, aggs={"n": "count"})
    a.process(0, s.from_columns({"ts": [0, 2, 3, 9, 10, 12, 13, -8, -7], "x": [0] * 9}, ids=list(range(1, 10))))
    out = a.process(0, Punctuation(END))[0]
    assert out[["window_start", "n"]].tolist() == [(-10, 1), (0, 2), (10, 2)]


def test_time_window_ids_deterministic_and_depend_on_operator_name():
    data = gen(random.Random(3), 30)
    a = run(TimeWindowAggregateLogic("a", [S], size=10, by="g"), [data, Punctuation(END)])
    b = run(TimeWindowAggregateLogic("a", [S], size=10, by="g"), [data[::-1], Punctuation(END)])
    c = run(TimeWindowAggregateLogic("b", [S], size=10, by="g"), [data, Punctuation(END)])
    assert a["id"].tolist() == b["id"].tolist()
    assert not set(a["id"].tolist()) & set(c["id"].tolist())


def test_time_window_id_formula():
    """docs/design.md: id = mix(hash(operator), mix(hash(group), window start))."""
    data = gen(random.Random(8), 20)
    out = run(TimeWindowAggregateLogic("agg", [S], size=10, slide=5, by="g"), [data, Punctuation(END)])
    gh = hash_columns(out, ("g",))
    want = mix(stable_hash("agg"), mix(gh, out["window_start"].view(np.uint64)))
    assert out["id"].tolist() == want.tolist()


def test_float_sum_is_exact_not_running():
    s = Schema({"x": "f8"})
    vals = [1e16, 1.0, -1e16, 1.0]
    outs = []
    for order in ([0, 1, 2, 3], [0, 2, 1, 3], [1, 3, 0, 2]):
        a = TimeWindowAggregateLogic("a", [s], size=10, aggs={"s": ("x", "sum")})
        for k in order:
            a.process(0, s.from_columns({"ts": [1], "x": [vals[k]]}, ids=[k + 1]))
        outs.append(a.process(0, Punctuation(END))[0]["s"].tolist())
    assert outs == [[2.0]] * 3


def test_late_tuple_dead_lettered_and_strict():
    s = Schema({"x": "i8"})
    a = TimeWindowAggregateLogic("a", [s], size=10, aggs={"n": "count"})
    a.process(0, Punctuation(9))
    a.process(0, s.from_columns({"ts": [9, 10], "x": [0, 0]}, ids=[1, 2]))
    assert a.late_count == 1 and a.dead_letters[0].batch["ts"].tolist() == [9]
    out = a.process(0, Punctuation(END))
    assert out[0][["window_start", "n"]].tolist() == [(10, 1)]
    strict = TimeWindowAggregateLogic("a", [s], size=10, aggs={"n": "count"}, strict=True)
    strict.process(0, Punctuation(9))
    with pytest.raises(PunctuationViolation, match="ts=9"):
        strict.process(0, s.from_columns({"ts": [9], "x": [0]}, ids=[1]))


def test_state_reused_after_windows_close():
    s = Schema({"k": "i8"})
    a = TimeWindowAggregateLogic("a", [s], size=5, by="k", aggs={"n": "count"})
    rng = random.Random(5)
    total = 0
    for w in range(40):
        ts = [w * 5 + rng.randrange(5) for _ in range(30)]
        a.process(0, s.from_columns({"ts": ts, "k": [rng.randrange(40) for _ in ts]},
                                    ids=list(range(w * 100, w * 100 + 30))))
        out = a.process(0, Punctuation(w * 5 + 4))
        total += int(out[0]["n"].sum())
        assert a.open_windows == 0
    assert total == 40 * 30


@pytest.mark.parametrize("kind", ["time", "count"])
def test_group_by_string_field(kind):
    s = Schema({"host": "U4", "x": "f8"})
    data = s.from_columns({"ts": [1, 2, 3, 4], "host": ["a", "bb", "a", "bb"], "x": [1.0, 2.0, 3.0, 4.0]},
                          ids=[1, 2, 3, 4])
    if kind == "time":
        op = TimeWindowAggregateLogic("a", [s], size=10, by="host", aggs={"s": ("x", "sum")})
    else:
        op = CountWindowAggregateLogic("a", [s], size=2, by="host", aggs={"s": ("x", "sum")})
    out = run(op, [data, Punctuation(END)])
    assert sorted(out[["host", "s"]].tolist()) == [("a", 4.0), ("bb", 6.0)]


def test_group_by_float_with_nan():
    s = Schema({"g": "f8"})
    a = TimeWindowAggregateLogic("a", [s], size=10, by="g", aggs={"n": "count"})
    a.process(0, s.from_columns({"ts": [1], "g": [np.nan]}, ids=[1]))
    a.process(0, s.from_columns({"ts": [2], "g": [np.nan]}, ids=[2]))
    out = a.process(0, Punctuation(END))[0]
    assert out["n"].tolist() == [2]


def test_group_by_signed_zero_is_one_group():
    s = Schema({"g": "f8"})
    a = TimeWindowAggregateLogic("a", [s], size=10, by="g", aggs={"n": "count"})
    a.process(0, s.from_columns({"ts": [1], "g": [-0.0]}, ids=[1]))
    a.process(0, s.from_columns({"ts": [2], "g": [0.0]}, ids=[2]))
    out = a.process(0, Punctuation(END))[0]
    assert out["n"].tolist() == [2]


def test_group_by_two_int_fields():
    s = Schema({"a": "i8", "b": "i4", "x": "i8"})
    data = s.from_columns({"ts": [1, 2, 3, 4], "a": [1, 1, 2, 1], "b": [1, 2, 1, 1], "x": [1, 2, 3, 4]},
                          ids=[1, 2, 3, 4])
    out = run(TimeWindowAggregateLogic("t", [s], size=10, by=("a", "b"), aggs={"s": ("x", "sum")}),
              [data, Punctuation(END)])
    assert sorted(out[["a", "b", "s"]].tolist()) == [(1, 1, 5), (1, 2, 2), (2, 1, 3)]


# -- parameters ---------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [TimeWindowAggregateLogic, CountWindowAggregateLogic])
def test_parameter_validation(cls):
    with pytest.raises(ValueError, match="size must be > 0"):
        cls("a", [S], size=0)
    with pytest.raises(ValueError, match="size must be > 0"):
        cls("a", [S], size=-5)
    with pytest.raises(ValueError, match="slide must be > 0"):
        cls("a", [S], size=5, slide=0)
    with pytest.raises(QueryError, match="group field 'nope'"):
        cls("a", [S], size=5, by="nope")
    with pytest.raises(QueryError, match="unknown field 'nope'"):
        cls("a", [S], size=5, aggs={"s": ("nope", "sum")})
    with pytest.raises(QueryError, match="unknown function 'median'"):
        cls("a", [S], size=5, aggs={"s": ("x", "median")})
    with pytest.raises(QueryError, match="clash"):
        cls("a", [S], size=5, by="g", aggs={"g": "count"})
    with pytest.raises(QueryError, match="exactly one input"):
        cls("a", [S, S], size=5)
    with pytest.raises(QueryError, match="at least one"):
        normalize_aggs({}, S, "agg")
    txt = Schema({"t": "U3"})
    with pytest.raises(QueryError, match="numeric.*'t'"):
        cls("a", [txt], size=5, aggs={"s": ("t", "sum")})


def test_output_dtypes():
    u = Schema({"u": "u4", "f": "f4", "i": "i2"})
    a = TimeWindowAggregateLogic("a", [u], size=5, aggs={"su": ("u", "sum"), "sf": ("f", "sum"), "si": ("i", "sum"),
                                                         "mi": ("i", "min"), "mf": ("f", "max"), "n": "count",
                                                         "avg": ("i", "mean")})
    dt = a.out_schema
    assert dt["su"] == np.uint64 and dt["sf"] == np.float64 and dt["si"] == np.int64
    assert dt["mi"] == np.int16 and dt["mf"] == np.float64 and dt["n"] == np.int64 and dt["avg"] == np.float64
    assert a.out_schema.names[:2] == ("window_start", "window_end")
    c = CountWindowAggregateLogic("c", [S], size=5, by="g", aggs={"n": "count"})
    assert c.out_schema.names == ("g", "window", "first_ts", "last_ts", "n")


# -- count windows: brute force --------------------------------------------------------------

def brute_count(batch, size, slide, by, aggs, name):
    slide = size if slide is None else slide
    srt = batch[canonical_order(batch)]
    groups = {}
    for k in range(len(srt)):
        groups.setdefault(tuple(srt[f][k].item() for f in by), []).append(k)
    res = {}
    for key, idx in groups.items():
        rows = srt[np.array(idx)]
        j = 0
        while j * slide + size <= len(rows):
            w = rows[j * slide: j * slide + size]
            d = summarize(w, aggs)
            d["_ts"] = int(w["ts"][-1])
            d["_first"] = int(w["ts"][0])
            gh = hash_columns(w[:1], tuple(by))[0] if by else np.uint64(0)
            d["_id"] = int(mix(stable_hash(name), np.uint64(gh), np.uint64(j)))
            res[key + (j,)] = d
            j += 1
    return res


def count_dict(out, by, aggs):
    res = {}
    for row in out:
        key = tuple(row[f].item() for f in by) + (int(row["window"]),)
        assert key not in res
        d = {a: row[a].item() for a in aggs}
        d["_ts"], d["_first"], d["_id"] = int(row["ts"]), int(row["first_ts"]), int(row["id"])
        assert row["last_ts"] == row["ts"]
        res[key] = d
    return res


COUNT_PARAMS = [(1, None), (3, None), (3, 1), (4, 2), (5, 3), (2, 5), (4, 4)]
COUNT_AGGS = {k: v for k, v in AGGS.items() if k != "n"} | {"n": "count"}


@PROPS
@given(st.sampled_from(COUNT_PARAMS), st.sampled_from([(), ("g",)]), st.integers(0, 2**32), st.integers(0, 60))
def test_count_window_matches_brute_force(params, by, seed, n):
    size, slide = params
    rng = random.Random(seed)
    data = gen(rng, n, t_lo=0, t_hi=40)  # many equal timestamps: the id tie-break matters
    op = CountWindowAggregateLogic("cw", [S], size=size, slide=slide, by=by, aggs=COUNT_AGGS)
    out = run(op, deliveries(data, rng, disorder=rng.randrange(0, 15), p_punct=0.4))
    want = brute_count(data, size, slide, by, COUNT_AGGS, "cw")
    got = count_dict(out, by, COUNT_AGGS)
    assert set(got) == set(want)
    for key in want:
        for a in want[key]:
            assert bits(got[key][a]) == bits(want[key][a]), (key, a, got[key][a], want[key][a])
    assert op.late_count == 0


@PROPS
@given(st.sampled_from(COUNT_PARAMS), st.integers(0, 2**32), st.integers(1, 60))
def test_count_window_independent_of_punctuation_spacing_and_order(params, seed, n):
    size, slide = params
    rng = random.Random(seed)
    data = gen(rng, n, t_lo=0, t_hi=30)
    outs = []
    for trial in range(3):
        r = random.Random(seed * 3 + trial)
        op = CountWindowAggregateLogic("cw", [S], size=size, slide=slide, by="g", aggs=COUNT_AGGS)
        outs.append(run(op, deliveries(data, r, disorder=r.randrange(0, 30), p_punct=r.choice([0.0, 0.3, 1.0]))))
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()


@PROPS
@given(st.sampled_from(COUNT_PARAMS), st.integers(0, 2**32), st.integers(1, 40))
def test_count_window_closes_when_last_tuple_released(params, seed, n):
    size, slide = params
    rng = random.Random(seed)
    data = gen(rng, n, t_lo=0, t_hi=50)
    want = brute_count(data, size, slide, ("g",), {"n": "count"}, "cw")
    op = CountWindowAggregateLogic("cw", [S], size=size, slide=slide, by="g", aggs={"n": "count"})
    emitted, p = set(), None
    for it in deliveries(data, rng, disorder=8, p_punct=0.5):
        out = op.process(0, it)
        if not isinstance(it, Punctuation):
            assert out == []
            continue
        for b in out:
            if not isinstance(b, Punctuation):
                emitted.update((int(r["g"]), int(r["window"])) for r in b)
        p = it.p if p is None else max(p, it.p)
        assert emitted == {k for k, d in want.items() if d["_ts"] <= p}


def test_count_window_docstring_example_and_tie_break():
    s = Schema({"x": "i8"})
    c = CountWindowAggregateLogic("c", [s], size=2, aggs={"s": ("x", "sum"), "f": ("x", Summary(lambda v: v[0], "i8"))})
    c.process(0, s.from_columns({"ts": [3, 1, 2], "x": [30, 10, 20]}, ids=[1, 2, 3]))
    out = c.process(0, Punctuation(5))
    assert out[0][["ts", "window", "first_ts", "last_ts", "s", "f"]].tolist() == [(2, 0, 1, 2, 30, 10)]
    # equal timestamps: ordered by id
    c.process(0, s.from_columns({"ts": [7, 7, 7], "x": [1, 2, 4]}, ids=[9, 5, 7]))
    out = c.process(0, Punctuation(END))
    # sequence: (3,id1,30), (7,id5,2), (7,id7,4), (7,id9,1)
    assert out[0][["window", "s", "f"]].tolist() == [(1, 32, 30), (2, 5, 4)]


def test_count_window_is_not_order_sensitive_flagged():
    # it sorts its own input: the query builder must not add a Sorter in front of it
    assert CountWindowAggregateLogic.order_sensitive is False

"""Filter, Map, FlatMap, Union (Hwang §IV-D): semantics, id rules, bad user functions."""
from __future__ import annotations

import numpy as np
import pytest

from replistream.errors import UserFunctionError
from replistream.ids import mix
from replistream.operators import FilterLogic, FlatMapLogic, MapLogic, UnionLogic
from replistream.schema import Punctuation, Schema

S = Schema({"k": "i8", "v": "f8"})


def batch(ts, k, v, ids):
    return S.from_columns({"ts": ts, "k": k, "v": v}, ids=ids)


B = batch([1, 2, 3, 4], [1, 2, 3, 4], [0.5, -1.0, 2.5, 4.0], [11, 12, 13, 14])


def only_batches(out):
    return [o for o in out if not isinstance(o, Punctuation)]


# -- Filter -----------------------------------------------------------------------

def test_filter_keeps_matching_rows_with_ids():
    f = FilterLogic("f", [S], lambda b: b["v"] > 0)
    (out,) = f.process(0, B)
    assert out.dtype == S.dtype
    assert out.tolist() == [(1, 11, 1, 0.5), (3, 13, 3, 2.5), (4, 14, 4, 4.0)]
    assert f.tuples_in == 4 and f.tuples_out == 3


def test_filter_nothing_passes_emits_nothing():
    f = FilterLogic("f", [S], lambda b: np.zeros(len(b), dtype=bool))
    assert f.process(0, B) == []


def test_filter_forwards_punctuation():
    f = FilterLogic("f", [S], lambda b: b["v"] > 0)
    assert f.process(0, Punctuation(7)) == [Punctuation(7)]


@pytest.mark.parametrize("pred", [
    lambda b: b["k"],                              # not boolean
    lambda b: np.ones(len(b) + 1, dtype=bool),     # wrong length
    lambda b: True,                                # scalar
])
def test_filter_bad_predicate_names_operator(pred):
    f = FilterLogic("pick", [S], pred)
    with pytest.raises(UserFunctionError, match="operator 'pick': filter predicate"):
        f.process(0, B)


# -- Map ----------------------------------------------------------------------------

def test_map_converts_and_keeps_ts_and_id():
    out_s = Schema({"k2": "i8", "w": "f8"})
    m = MapLogic("m", [S], lambda b: {"k2": b["k"] * 2, "w": b["v"] + 1}, out_s)
    (out,) = m.process(0, B)
    assert out.dtype == out_s.dtype
    assert out["ts"].tolist() == B["ts"].tolist()
    assert out["id"].tolist() == B["id"].tolist()
    assert out["k2"].tolist() == [2, 4, 6, 8]
    assert out["w"].tolist() == [1.5, 0.0, 3.5, 5.0]


def test_map_accepts_structured_result_and_converts_dtypes():
    out_s = Schema({"w": "f8"})

    def fn(b):
        r = np.zeros(len(b), dtype=[("w", "i4")])
        r["w"] = b["k"]
        return r

    (out,) = MapLogic("m", [S], fn, out_s).process(0, B)
    assert out["w"].tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("fn, word", [
    (lambda b: [1, 2, 3, 4], "mapping"),
    (lambda b: {"w": b["v"][:2]}, "'w'"),
    (lambda b: {}, "'w'"),
    (lambda b: {"w": b["v"], "extra": b["v"]}, "extra"),
    (lambda b: {"w": np.array(["a"] * len(b))}, "'w'"),
    (lambda b: {"w": b["v"], "ts": b["ts"]}, "'ts'"),
    (lambda b: {"w": b["v"], "id": b["id"]}, "'id'"),
])
def test_map_bad_results_name_operator(fn, word):
    m = MapLogic("scale", [S], fn, Schema({"w": "f8"}))
    with pytest.raises(UserFunctionError, match="operator 'scale': map 'scale'") as ei:
        m.process(0, B)
    assert word in str(ei.value)


# -- FlatMap -------------------------------------------------------------------------

OUT = Schema({"j": "i8"})


def explode(b):
    """k copies of each row (j = 0..k-1)."""
    parent = np.repeat(np.arange(len(b)), b["k"])
    j = np.concatenate([np.arange(n) for n in b["k"]]) if len(b) else np.zeros(0, np.int64)
    return parent, {"j": j}


def test_flat_map_outputs_keep_parent_ts_and_get_unique_ids():
    fm = FlatMapLogic("fm", [S], explode, OUT)
    (out,) = fm.process(0, B)
    assert len(out) == 1 + 2 + 3 + 4
    assert out["ts"].tolist() == [1, 2, 2, 3, 3, 3, 4, 4, 4, 4]
    assert out["j"].tolist() == [0, 0, 1, 0, 1, 2, 0, 1, 2, 3]
    ids = out["id"].tolist()
    assert len(set(ids)) == len(ids)
    assert not set(ids) & set(B["id"].tolist())
    # id = mix(parent id, index among the parent's outputs)
    want = [int(mix(np.uint64(p), np.uint64(i))) for p, n in zip(B["id"].tolist(), B["k"].tolist())
            for i in range(n)]
    assert ids == want


def test_flat_map_ids_deterministic_and_independent_of_batching():
    a = FlatMapLogic("fm", [S], explode, OUT).process(0, B)[0]
    b = FlatMapLogic("fm2", [S], explode, OUT)
    parts = b.process(0, B[2:]) + b.process(0, B[:2])
    got = np.concatenate(parts)
    assert sorted(got["id"].tolist()) == sorted(a["id"].tolist())
    assert sorted(got.tolist()) == sorted(a.tolist())


def test_flat_map_ordinal_follows_order_within_parent_even_if_interleaved():
    def interleave(b):
        # outputs returned as parent 0, 1, 0, 1
        return np.array([0, 1, 0, 1]), {"j": np.array([100, 200, 101, 201])}

    (out,) = FlatMapLogic("fm", [S], interleave, OUT).process(0, B[:2])
    p0, p1 = np.uint64(B["id"][0]), np.uint64(B["id"][1])
    assert out["id"].tolist() == [int(mix(p0, np.uint64(0))), int(mix(p1, np.uint64(0))),
                                  int(mix(p0, np.uint64(1))), int(mix(p1, np.uint64(1)))]
    assert out["ts"].tolist() == [1, 2, 1, 2]


def test_flat_map_zero_outputs():
    fm = FlatMapLogic("fm", [S], lambda b: (np.zeros(0, dtype=np.int64), {"j": np.zeros(0, np.int64)}), OUT)
    assert fm.process(0, B) == []


@pytest.mark.parametrize("fn, word", [
    (lambda b: {"j": b["k"]}, "parent_index, columns"),
    (lambda b: (np.array([0.5]), {"j": [1]}), "integer"),
    (lambda b: (np.array([len(b)]), {"j": [1]}), "outside"),
    (lambda b: (np.array([-1]), {"j": [1]}), "outside"),
    (lambda b: (np.array([0, 1]), {"j": [1]}), "'j'"),
    (lambda b: (np.array([0]), {"j": ["x"]}), "'j'"),
])
def test_flat_map_bad_results_name_operator(fn, word):
    fm = FlatMapLogic("split", [S], fn, OUT)
    with pytest.raises(UserFunctionError, match="operator 'split': flat_map 'split'") as ei:
        fm.process(0, B)
    assert word in str(ei.value)


# -- Union ----------------------------------------------------------------------------

def test_union_mixes_id_with_port_and_keeps_values():
    u = UnionLogic("u", [S, S, S])
    out0 = u.process(0, B)[0]
    out2 = u.process(2, B)[0]
    assert out0[["ts", "k", "v"]].tolist() == B[["ts", "k", "v"]].tolist()
    assert out0["id"].tolist() == mix(B["id"], np.uint64(1)).tolist()
    assert out2["id"].tolist() == mix(B["id"], np.uint64(3)).tolist()
    # the same tuple on two inputs stays two logical tuples
    assert not set(out0["id"].tolist()) & set(out2["id"].tolist())
    # and the input batch is not modified
    assert B["id"].tolist() == [11, 12, 13, 14]


def test_union_deterministic_across_instances():
    a = UnionLogic("u", [S, S]).process(1, B)[0]
    b = UnionLogic("other", [S, S]).process(1, B)[0]
    assert a.tobytes() == b.tobytes()


def test_union_forwards_minimum_punctuation():
    u = UnionLogic("u", [S, S])
    assert u.process(0, Punctuation(10)) == []
    assert u.process(1, Punctuation(4)) == [Punctuation(4)]
    assert u.process(1, Punctuation(20)) == [Punctuation(10)]
    assert u.process(0, Punctuation(15)) == [Punctuation(15)]


def test_union_late_tuple_per_port():
    u = UnionLogic("u", [S, S])
    u.process(0, Punctuation(2))
    out = u.process(1, B)  # port 1 made no promise
    assert len(only_batches(out)[0]) == 4
    out = u.process(0, B)
    assert only_batches(out)[0]["ts"].tolist() == [3, 4]
    assert u.late_count == 2
    assert u.dead_letters[0].where == "u input 0"

"""Entry points (Hwang §II-B): ids, punctuation policy, late and malformed input."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replistream.errors import PunctuationViolation, SchemaError
from replistream.ids import mix, stable_hash
from replistream.operators.entry import EntryLogic, source_stream
from replistream.schema import END, Punctuation, Schema

PROPS = settings(max_examples=80, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])
S = Schema({"x": "i8"})
NO_P = int(np.iinfo(np.int64).min)


def recs(ts):
    return [{"ts": int(t), "x": k} for k, t in enumerate(ts)]


def P(m, every, d):
    return (m - d) // every * every - 1


def push_all(entry, chunks):
    out = []
    for c in chunks:
        out.extend(entry.push(c))
    return out


def tuples(items):
    b = [i for i in items if not isinstance(i, Punctuation)]
    return np.concatenate(b) if b else S.empty()


def puncts(items):
    return [i.p for i in items if isinstance(i, Punctuation)]


def split(seq, rng):
    out, k = [], 0
    while k < len(seq):
        m = rng.randint(1, 5)
        out.append(seq[k:k + m])
        k += m
    return out


# -- ids ------------------------------------------------------------------------

def test_ids_deterministic_unique_and_per_source():
    data = recs([5, 3, 9, 9, 1])
    a = tuples(EntryLogic("load", S).push(data))
    b = tuples(push_all(EntryLogic("load", S), [data[:2], data[2:3], data[3:]]))
    c = tuples(EntryLogic("ping", S).push(data))
    assert a.tobytes() == b.tobytes()
    assert len(set(a["id"].tolist())) == 5
    assert not set(a["id"].tolist()) & set(c["id"].tolist())
    assert a["x"].tolist() == [0, 1, 2, 3, 4] and a["ts"].tolist() == [5, 3, 9, 9, 1]


def test_id_formula():
    """docs/design.md: id = mix(hash("source:" + name), sequence number)."""
    out = tuples(push_all(EntryLogic("load", S), [recs([1, 2]), recs([3])]))
    want = mix(stable_hash("source:load"), np.arange(3, dtype=np.uint64))
    assert out["id"].tolist() == want.tolist()


def test_ids_count_late_and_rejected_records():
    """The id of record i depends only on i, not on which earlier records were dropped."""
    data = recs([10, 20, 5, 30])
    ref = tuples(EntryLogic("s", S).push(data))
    e = EntryLogic("s", S, punctuate_every=10)
    got = tuples(push_all(e, [data[:2], data[2:]]))  # record 2 (ts 5) is late after P(20) = 19
    assert e.late_count == 1
    assert got["id"].tolist() == [ref["id"][k] for k in (0, 1, 3)]


@pytest.mark.parametrize("form", ["records", "columns", "structured", "structured_with_id"])
def test_input_forms_give_same_stream(form):
    data = recs([4, 2, 8])
    want = tuples(EntryLogic("s", S).push(data))
    if form == "records":
        chunk = data
    elif form == "columns":
        chunk = {"ts": [4, 2, 8], "x": [0, 1, 2]}
    else:
        chunk = S.from_columns({"ts": [4, 2, 8], "x": [0, 1, 2]}, ids=[0, 0, 0] if form == "structured" else [7, 7, 7])
    got = tuples(EntryLogic("s", S).push(chunk))
    assert got.tobytes() == want.tobytes()


def test_columns_setting_id_rejected():
    with pytest.raises(SchemaError, match="'id'"):
        EntryLogic("s", S).push({"ts": [1], "x": [1], "id": [3]})


# -- punctuations -------------------------------------------------------------------

def test_docstring_example():
    e = EntryLogic("src", S, punctuate_every=10)
    out = e.push([{"ts": 3, "x": 1}, {"ts": 12, "x": 2}])
    assert len(out[0]) == 2 and out[1] == Punctuation(9)
    assert e.push([{"ts": 8, "x": 3}]) == [] and e.late_count == 1
    assert e.close() == [Punctuation(END)]


@PROPS
@given(st.integers(1, 50), st.integers(0, 30), st.lists(st.integers(-200, 400), max_size=40),
       st.integers(0, 2**32))
def test_punctuation_alignment(every, d, ts, seed):
    rng = random.Random(seed)
    e = EntryLogic("s", S, punctuate_every=every, max_disorder=d)
    m, last = None, None
    for chunk in split(recs(ts), rng):
        out = e.push(chunk)
        acc = tuples(out)
        if len(acc):
            m = max(m if m is not None else NO_P, int(acc["ts"].max()))
        ps = puncts(out)
        assert len(ps) <= 1
        if m is not None:
            want = P(m, every, d)
            if last is None or want > last:
                assert ps == [want]
                last = want
            else:
                assert ps == []
        else:
            assert ps == []
        if ps:
            assert (ps[0] + 1) % every == 0
            assert not isinstance(out[0], Punctuation) or len(out) == 1  # tuples go before the punctuation


@PROPS
@given(st.one_of(st.none(), st.integers(1, 30)), st.integers(0, 20), st.lists(st.integers(0, 300), max_size=50),
       st.integers(0, 2**32), st.floats(0, 0.3))
def test_late_tuples_same_under_any_chunking(every, d, ts, seed, p_explicit):
    """Tuple i is late iff ts_i <= the punctuation in force after tuples 0..i-1, whatever the chunking."""
    rng = random.Random(seed)
    data = recs(ts)
    # explicit punctuations at fixed positions in the record sequence
    explicit = {k: rng.randrange(0, 300) for k in range(len(data)) if rng.random() < p_explicit}
    # brute force, one record at a time
    late, m, bar = [], None, NO_P
    for k, r in enumerate(data):
        if k in explicit:
            bar = max(bar, explicit[k])
        in_force = max(bar, P(m, every, d) if (m is not None and every) else NO_P)
        if r["ts"] <= in_force:
            late.append(k)
        else:
            m = r["ts"] if m is None else max(m, r["ts"])
    results = []
    for trial in range(3):
        r2 = random.Random(seed + trial)
        seq, k = [], 0
        while k < len(data):
            if k in explicit:
                seq.append(Punctuation(explicit[k]))
            n = r2.randint(1, 6)
            stop = min([j for j in explicit if j > k] + [k + n, len(data)])
            seq.append(data[k:stop])
            k = stop
        e = EntryLogic("s", S, punctuate_every=every, max_disorder=d)
        out = push_all(e, seq)
        assert e.late_count == len(late)
        dead = np.concatenate([dl.batch for dl in e.dead_letters]) if e.dead_letters else S.empty()
        assert sorted(dead["x"].tolist()) == late
        got = tuples(out)
        assert got["x"].tolist() == [k for k in range(len(data)) if k not in set(late)]
        results.append(got.tobytes())
        ps = puncts(out)
        assert ps == sorted(set(ps))  # strictly increasing
    assert results[0] == results[1] == results[2]


def test_tuples_respect_emitted_punctuations():
    rng = random.Random(4)
    e = EntryLogic("s", S, punctuate_every=7, max_disorder=5)
    bar = NO_P
    for _ in range(50):
        ts = [rng.randrange(0, 500) for _ in range(rng.randint(1, 8))]
        for it in e.push(recs(ts)):
            if isinstance(it, Punctuation):
                bar = it.p
            else:
                assert (it["ts"] > bar).all()


def test_explicit_punctuations():
    e = EntryLogic("s", S)  # no automatic punctuations
    out = e.push(recs([100]))
    assert puncts(out) == []
    assert e.push(Punctuation(50)) == [Punctuation(50)]
    assert e.push(Punctuation(40)) == []  # weaker: not forwarded
    assert e.push(Punctuation(50)) == []
    out = e.push(recs([50, 51]))
    assert tuples(out)["ts"].tolist() == [51] and e.late_count == 1
    assert e.push(Punctuation(60)) == [Punctuation(60)]


def test_explicit_punctuation_below_automatic_one_not_forwarded():
    e = EntryLogic("s", S, punctuate_every=10)
    assert puncts(e.push(recs([35]))) == [29]
    assert e.push(Punctuation(20)) == []
    assert e.push(Punctuation(31)) == [Punctuation(31)]
    assert puncts(e.push(recs([36]))) == []  # P(36) = 29 < 31


def test_strict_mode_raises_on_late_tuple():
    e = EntryLogic("load", S, punctuate_every=10, strict=True)
    e.push(recs([25]))
    with pytest.raises(PunctuationViolation, match="source 'load'.*ts=19.*19"):
        e.push(recs([19]))
    e2 = EntryLogic("load", S, strict=True)
    e2.push(Punctuation(5))
    with pytest.raises(PunctuationViolation):
        e2.push(recs([5]))


def test_close_emits_end_once_and_blocks_further_input():
    e = EntryLogic("s", S, punctuate_every=10)
    e.push(recs([1, 2]))
    assert e.close() == [Punctuation(END)]
    assert e.close() == []
    with pytest.raises(ValueError, match="closed"):
        e.push(recs([3]))


def test_source_stream_runs_and_closes():
    items = source_stream(EntryLogic("s", S, punctuate_every=5), [recs([1, 2]), Punctuation(3), recs([7])])
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["ndarray", "Punctuation", "Punctuation", "ndarray", "Punctuation", "Punctuation"]
    assert puncts(items) == [-1, 3, 4, END]  # P(2) = floor(2 / 5) * 5 - 1 = -1, P(7) = 4


# -- malformed input -------------------------------------------------------------------

def test_malformed_raises_naming_field_by_default():
    e = EntryLogic("load", Schema({"cpu": "f8"}))
    with pytest.raises(SchemaError, match="source 'load'.*'cpu'"):
        e.push([{"ts": 1, "cpu": 0.5}, {"ts": 2, "cpu": "high"}])
    with pytest.raises(SchemaError, match="'ts'"):
        e.push([{"ts": float("nan"), "cpu": 0.5}])
    with pytest.raises(SchemaError, match="'ts'"):
        e.push([{"ts": 1.5, "cpu": 0.5}])
    with pytest.raises(SchemaError, match="'cpu'"):
        e.push([{"ts": 1}])


def test_on_malformed_dead_letter_keeps_stream_flowing():
    s = Schema({"cpu": "f8"})
    good = [{"ts": 1, "cpu": 0.5}, {"ts": 2, "cpu": 1.0}, {"ts": 3, "cpu": 2.0}, {"ts": 4, "cpu": 3.0}]
    bad = [good[0], {"ts": 2, "cpu": "high"}, good[2], {"ts": 3.5, "cpu": 1.0}, {"ts": 4, "cpu": 3.0}]
    ref = tuples(EntryLogic("load", s).push(good + [good[3]]))  # five well-formed records: ids 0..4
    e = EntryLogic("load", s, punctuate_every=2, on_malformed="dead_letter")
    out = e.push(bad)
    got = tuples(out)
    assert got["ts"].tolist() == [1, 3, 4]
    assert got["id"].tolist() == [ref["id"][0], ref["id"][2], ref["id"][4]]  # ids by position
    assert e.malformed_count == 2 and e.stats()["malformed"] == 2
    reasons = [d.reason for d in e.dead_letters]
    assert any("'cpu'" in r for r in reasons) and any("'ts'" in r for r in reasons)
    assert [d.batch[0] for d in e.dead_letters] == [bad[1], bad[3]]
    assert puncts(out) == [3]
    # and later input still flows
    assert tuples(e.push([{"ts": 9, "cpu": 1.0}]))["ts"].tolist() == [9]


def test_on_malformed_dead_letter_all_bad_chunk():
    e = EntryLogic("load", Schema({"cpu": "f8"}), on_malformed="dead_letter")
    assert e.push([{"ts": "x", "cpu": 1.0}]) == []
    assert e.malformed_count == 1


@pytest.mark.parametrize("kw, word", [
    (dict(punctuate_every=0), "punctuate_every"),
    (dict(punctuate_every=-3), "punctuate_every"),
    (dict(max_disorder=-1), "max_disorder"),
    (dict(on_malformed="ignore"), "on_malformed"),
])
def test_parameter_validation(kw, word):
    with pytest.raises(ValueError, match=word):
        EntryLogic("s", S, **kw)


def test_unreadable_input():
    with pytest.raises(SchemaError, match="source 's'"):
        EntryLogic("s", S).push(42)

"""Cutting a source's input into chunks (sources.iter_chunks): whole arrays, column mappings and
long record lists are cut at ``chunk_size`` rows, and the cut never changes a run's result."""
from __future__ import annotations

import numpy as np
import pytest

import replistream as rs
from replistream.schema import Punctuation
from replistream.sources import KillReplica, iter_chunks
from replistream.testing import assert_same_output, run_reference, run_replicated


def rows(c) -> int:
    return len(c["ts"]) if isinstance(c, dict) else len(c)


def test_whole_structured_array_is_cut():
    s = rs.Schema({"x": "i8"})
    arr = s.from_columns({"ts": np.arange(25), "x": np.arange(25)})
    chunks = list(iter_chunks(arr, 10))
    assert [len(c) for c in chunks] == [10, 10, 5]
    assert np.concatenate(chunks).tolist() == arr.tolist()


def test_column_mapping_of_lists_arrays_and_pandas_is_cut():
    pd = pytest.importorskip("pandas")
    data = {"ts": list(range(7)), "x": np.arange(7) * 2, "y": pd.Series(np.arange(7) * 3, index=np.arange(7) + 100)}
    chunks = list(iter_chunks(data, 3))
    assert [rows(c) for c in chunks] == [3, 3, 1]
    assert [list(c["ts"]) for c in chunks] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [list(c["y"]) for c in chunks] == [[0, 3, 6], [9, 12, 15], [18]]


def test_unequal_columns_are_passed_whole_for_the_entry_point_to_reject():
    data = {"ts": np.arange(7), "x": np.arange(6)}
    chunks = list(iter_chunks(data, 3))
    assert len(chunks) == 1 and chunks[0] is data


def test_big_chunks_inside_an_iterable_are_cut_and_order_is_kept():
    s = rs.Schema({"x": "i8"})
    arr = s.from_columns({"ts": np.arange(5), "x": np.zeros(5, dtype=np.int64)})
    recs = [{"ts": 10 + i, "x": 1} for i in range(5)]
    kill = KillReplica("f", 0)
    items = list(iter_chunks([arr, Punctuation(4), recs, kill, {"ts": 20, "x": 2}], 2))
    kinds = [type(c).__name__ for c in items]
    assert kinds == ["ndarray"] * 3 + ["Punctuation"] + ["list"] * 3 + ["KillReplica", "list"]
    assert [rows(c) for c in items if isinstance(c, (list, np.ndarray))] == [2, 2, 1, 2, 2, 1, 1]


@pytest.mark.parametrize("bad", [0, -1, 2.5, "10"])
def test_chunk_size_must_be_positive(bad):
    with pytest.raises((ValueError, TypeError)):
        list(iter_chunks([{"ts": 1}], bad))


def late_and_malformed_input(n=5_000, seed=3):
    """Column input with disorder beyond max_disorder (late tuples) and, in a second source,
    records with bad values: the dead letters must not depend on chunking."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, 200_000, n)) + rng.integers(-3_000, 3_000, n)
    cols = {"ts": ts, "key": rng.integers(0, 7, n)}
    recs = [{"ts": int(t), "key": int(k)} for t, k in zip(np.sort(rng.integers(0, 200_000, 400)), rng.integers(0, 7, 400))]
    for i in rng.choice(400, 12, replace=False):
        recs[i] = {"ts": "soon", "key": 1} if i % 2 else {"ts": recs[i]["ts"]}
    return cols, recs


def keyed_query():
    q = rs.Query("chunks")
    a = q.source("a", {"key": "i8"}, punctuate_every=1_000, max_disorder=1_000)
    b = q.source("b", {"key": "i8"}, punctuate_every=1_000)
    a.union(b).window(size=10_000, by="key", aggs={"n": "count"}).sink("counts")
    return q.build()


@pytest.mark.slow  # 2.7 s of the quick subset (#31); the module keeps its fast cases
def test_cutting_does_not_change_results_or_dead_letters():
    q = keyed_query()
    cols, recs = late_and_malformed_input()
    whole = run_reference(q, {"a": cols, "b": recs}, on_malformed="dead_letter")
    late = [d for d in whole.dead_letters if "late" in d.reason]
    assert late and sum(d.count for d in late) > 0, "the input must have late tuples for this test to bite"
    for size in (1, 7, 1_000):
        cut = run_reference(q, {"a": list(iter_chunks(cols, size)), "b": list(iter_chunks(recs, size))},
                           on_malformed="dead_letter")
        assert_same_output(whole.outputs["counts"], cut.outputs["counts"])
        assert sorted((d.where, d.reason, d.count) for d in _merge(whole.dead_letters)) == \
            sorted((d.where, d.reason, d.count) for d in _merge(cut.dead_letters))


def _merge(letters):
    """Dead letters of one (where, reason) summed, as one chunk would give them."""
    from replistream.errors import DeadLetter

    by = {}
    for d in letters:
        by.setdefault((d.where, d.reason), []).append(d.batch)
    return [DeadLetter(w, r, np.concatenate(v)) for (w, r), v in by.items()]


def test_replicated_run_with_a_whole_mapping_matches_the_reference():
    q = keyed_query()
    cols, recs = late_and_malformed_input(seed=5)
    data = {"a": cols, "b": recs}
    ref = run_reference(q, data, on_malformed="dead_letter")
    rep = run_replicated(q, data, k=2, seed=5, on_malformed="dead_letter")
    assert_same_output(ref.outputs["counts"], rep.outputs["counts"])


@pytest.mark.parametrize("seed", range(6))
def test_paced_pieces_end_at_every_row_that_raises_the_punctuation(seed):
    """A paced replay sends each piece at its last row's time: so that batching never delays a
    window's close, every row that raises the source's punctuation ends its piece (across chunk
    boundaries too), each piece spans at most ``span`` µs, and the pieces are the input in order."""
    from replistream.schema import Schema
    from replistream.operators.entry import EntryLogic
    from replistream.sources import paced_pieces

    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 400))
    ts = np.sort(rng.integers(0, 5_000, n))
    if seed % 2:  # some disorder: the running maximum decides
        ts = ts + rng.integers(0, 30, n)
    entry = EntryLogic("s", Schema({"x": "i8"}), punctuate_every=int(rng.choice([7, 50, 300])),
                       max_disorder=int(rng.integers(0, 20)))
    span = int(rng.integers(1, 200))
    chunks = [{"ts": c, "x": np.zeros(len(c), dtype=np.int64)} for c in np.array_split(ts, int(rng.integers(1, 8)))]
    pieces = [p for p in paced_pieces(iter(chunks), span, entry.auto_punctuation) if len(p["ts"])]
    assert np.concatenate([p["ts"] for p in pieces]).tolist() == ts.tolist()
    run_max = np.maximum.accumulate(ts)
    punct = entry.auto_punctuation(run_max)
    raises = set((np.flatnonzero(np.diff(np.r_[punct[0] - 1, punct]) > 0)).tolist())
    ends, at = set(), 0
    for p in pieces:
        m = run_max[at:at + len(p["ts"])]
        assert m[-1] - m[0] <= span or len(p["ts"]) == 1
        inner = set(range(at, at + len(p["ts"]) - 1))
        assert not inner & raises, "a row that raises the punctuation must end its piece"
        at += len(p["ts"])
        ends.add(at - 1)
    assert raises <= ends


def test_chunk_tmax_of_integer_columns_agrees_with_the_per_row_reading():
    """chunk_tmax reads an int64 ts column with numpy (a paced piece's hot path); it must give what
    the per-row reading of the same values gives, extremes included (NO_PUNCTUATION and END are
    not readable timestamps)."""
    from replistream.operators.base import NO_PUNCTUATION
    from replistream.schema import END
    from replistream.sources import chunk_tmax

    rng = np.random.default_rng(3)
    cases = [np.array([], dtype=np.int64), np.array([END], dtype=np.int64), np.array([NO_PUNCTUATION, 5], dtype=np.int64),
             np.array([7, END, 3], dtype=np.int64), rng.integers(-10**12, 10**12, 500), np.array([4, 9], dtype=np.int32)]
    for ts in cases:
        assert chunk_tmax({"ts": ts}) == chunk_tmax({"ts": [int(v) for v in ts]}), ts


def test_a_source_batch_is_cut_by_time_with_its_rows_set_aside_in_place():
    """A SourceBatch (rows a reading task converted, some set aside) cut into paced pieces: every
    record (good or set aside) in exactly one piece, in order, positions from 0 in each, and an
    entry point gives the pieces the ids and dead letters it gives the whole batch."""
    from replistream.operators.entry import EntryLogic, SourceBatch
    from replistream.schema import Schema
    from replistream.sources import cut_by_time

    schema = Schema({"x": "i8"})
    rng = np.random.default_rng(4)
    n = 400
    bad = np.sort(rng.choice(n, 30, replace=False))
    good = np.setdiff1d(np.arange(n), bad)
    ts = np.sort(rng.integers(0, 10_000, len(good)))
    sb = SourceBatch(schema.from_columns({"ts": ts, "x": good}), n=n, positions=good,
                     rejected=[(int(p), "null", {"ts": None}) for p in bad])
    pieces = list(cut_by_time(sb, 500))
    assert len(pieces) > 5 and all(isinstance(p, SourceBatch) for p in pieces)
    assert sum(p.n for p in pieces) == n
    assert np.concatenate([p.data["x"] for p in pieces]).tolist() == good.tolist()
    whole, cut = EntryLogic("s", schema), EntryLogic("s", schema)
    ids_whole = np.concatenate([b["id"] for b in whole.push(sb) if len(b)])
    ids_cut = np.concatenate([b["id"] for p in pieces for b in cut.push(p) if len(b)])
    assert ids_whole.tolist() == ids_cut.tolist()
    assert [d.count for d in whole.dead_letters] != [] and sum(d.count for d in cut.dead_letters) == len(bad)


def test_a_record_stamped_end_does_not_carry_its_source_to_the_end_of_time():
    """A malformed record with the reserved ``END`` timestamp (set aside by the entry points) has no
    time in the event-time merge: the chunks after it keep their own times, so a paced replay
    still waits for them (before, every later chunk took END's place and was sent at once)."""
    from replistream.schema import END
    from replistream.sources import TimeMerge

    chunks = [{"ts": np.array([1_000, 2_000])}, [{"ts": END, "x": 0}], {"ts": np.array([5_000_000, 6_000_000])},
              [{"ts": None, "x": 0}, {"ts": 7_000_000, "x": 1}], np.array([(8_000_000,)], dtype=[("ts", "i8")])]
    times = [t for t, _, c in TimeMerge({"s": iter(chunks)}) if c is not None]
    assert times == [1_000, 1_000, 5_000_000, 7_000_000, 8_000_000]

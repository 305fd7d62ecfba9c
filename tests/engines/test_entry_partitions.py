"""Entry partitions on the in-process engine (issue #41, point 4): ``parallelism={"entry": p}``
runs the entry points as ``p`` partitions x ``k`` replicas (``entry.P#R``); one feeder hands
each chunk of a source to one partition with the state an unpartitioned entry point would be in
before it (:class:`~replistream.operators.entry.EntrySplit`). Output, every tuple's id, and which
tuples are late or malformed (each dead letter once) equal the reference run's, for files and
in-memory sources, with random crashes and named kills of entry partition replicas.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replistream import END, FileSource, Query, QueryError, seconds
from replistream.operators.entry import EntryLogic, EntrySplit, partition_streams
from replistream.schema import Punctuation, Schema
from replistream.sources import KillReplica, Revive, StopReplica
from replistream.testing import assert_same_output, run_reference, run_replicated


def letters(result) -> list[tuple[str, str, str]]:
    """Every dead-lettered row (its id, or the record for a malformed one) with where and why."""
    out = []
    for d in result.dead_letters:
        names = d.batch.dtype.names or ()
        out += [(d.where, d.reason, int(r["id"]) if "id" in names else repr(r)) for r in d.batch]
    return sorted(out)


def same_run(ref, rep) -> None:
    assert rep.complete
    for app in ref.outputs:
        assert len(ref.outputs[app])
        assert_same_output(ref.outputs[app], rep.outputs[app])  # rows, ids included
    assert letters(rep) == letters(ref)


def memory_case():
    """Two sources of records out of order (late rows), with malformed records and an explicit
    punctuation among the chunks; a passthrough filter keeps the entry points' ids to the output."""
    q = Query("mem")
    a = q.source("a", {"k": "i8", "v": "f8"}, punctuate_every=seconds(2), max_disorder=seconds(1))
    b = q.source("b", {"k": "i8"}, punctuate_every=seconds(3))
    a.filter(lambda t: t["v"] > -1e9, name="pass").sink("rows")
    a.union(b.map(lambda t: {"k": t["k"], "v": t["k"] * 1.0}, {"k": "i8", "v": "f8"}, name="m"), name="u") \
        .window(size=seconds(4), by="k", aggs={"n": "count"}, name="w").sink("counts")
    rng = np.random.default_rng(41)
    ra = [{"ts": seconds(t) + int(rng.integers(-seconds(3), seconds(1))), "k": int(rng.integers(0, 6)),
           "v": float(rng.normal())} for t in range(240)]
    ra[17] = {"ts": seconds(16), "k": "seven", "v": 1.0}  # malformed: a string key
    ra[100] = {"ts": seconds(999), "v": 1.0}  # malformed: no key (its large ts must not count)
    ra[161] = None
    rb = [{"ts": seconds(t) + int(rng.integers(-seconds(4), 1)), "k": int(rng.integers(0, 6))} for t in range(0, 240, 2)]
    chunks_a = [ra[i:i + 13] for i in range(0, 240, 13)]
    chunks_a.insert(5, Punctuation(seconds(70)))  # explicit: rows of the next chunks at or below it are late
    chunks_b = [rb[i:i + 9] for i in range(0, len(rb), 9)]
    return q.build(), {"a": chunks_a, "b": chunks_b}


def write_files(d: str) -> None:
    """Four Parquet files, rows out of order (late ones), a null key (a bad row) in two."""
    rng = np.random.default_rng(7)
    t0 = 0
    for i in range(4):
        n = 150 + 20 * i
        t = t0 + np.arange(n) * 1000 + rng.integers(-4000, 1000, n)
        k = rng.integers(0, 8, n).astype(object)
        if i % 2:
            k[n // 2] = None
        pq.write_table(pa.table({"t": t, "k": pa.array(k.tolist(), pa.int64()), "v": rng.normal(size=n)}),
                       os.path.join(d, f"part-{i}.parquet"))
        t0 += n * 1000


def files_case(d: str):
    write_files(d)
    src = FileSource(d, time="t", chunk_size=40)
    q = Query("files")
    s = src.declare(q, "load", punctuate_every=5000, max_disorder=1000)
    s.filter(lambda t: t["v"] > -1e9, name="pass").sink("rows")
    s.window(size=20_000, by="k", aggs={"n": "count", "sv": ("v", "sum")}, name="w").sink("counts")
    return q.build(), {"load": src}


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("k", [1, 2])
def test_in_memory_sources_split_between_entry_partitions_match_the_reference(p, k):
    q, data = memory_case()
    ref = run_reference(q, data, on_malformed="dead_letter")
    assert any(d.reason.startswith("late") for d in ref.dead_letters)
    assert sum(d.reason.startswith("malformed") for d in ref.dead_letters) >= 2
    rep = run_replicated(q, data, k=k, seed=10 * p + k, crash=k > 1, audit=True, parallelism={"entry": p})
    same_run(ref, rep)
    per_part = rep.stats["entry_partitions"]["a"]
    assert len(per_part) == p and all(st["tuples_out"] > 0 for st in per_part)  # every partition took chunks


@pytest.mark.parametrize("p,k", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_a_directory_of_parquet_files_split_between_entry_partitions_matches_the_reference(tmp_path, p, k):
    q, data = files_case(str(tmp_path))
    ref = run_reference(q, data)
    assert any(d.reason.startswith("late") for d in ref.dead_letters)
    assert any(d.reason.startswith("malformed") for d in ref.dead_letters)
    rep = run_replicated(q, data, k=k, seed=p + k, crash=k > 1, parallelism={"entry": p, "w": 2})
    same_run(ref, rep)


def test_a_named_entry_partition_replica_killed_or_stopped_keeps_the_output_exact():
    q, data = memory_case()
    ref = run_reference(q, data, on_malformed="dead_letter")
    a = list(data["a"])
    a.insert(4, KillReplica("entry.1", 0))
    a.insert(9, StopReplica("entry.0", 1))
    rep = run_replicated(q, {**data, "a": a}, k=2, seed=3, parallelism={"entry": 2})
    assert sorted(rep.stats["harness"].crashed) == ["a.1#0", "b.1#0"]
    assert sorted(rep.stats["harness"].stopped) == ["a.0#1", "b.0#1"]
    same_run(ref, rep)


def test_entry_partitions_refuse_what_they_cannot_take_in_one_line():
    q, data = memory_case()
    for ev, says in [(KillReplica("entry", 0), "name one of them: entry.0, entry.1"),
                     (Revive("w", 0), "drop parallelism['entry']")]:
        with pytest.raises(QueryError) as e:
            run_replicated(q, {**data, "a": [ev, *data["a"]]}, k=2, seed=1, parallelism={"entry": 2})
        assert says in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(QueryError, match="the entry points are not partitioned; name them 'entry'"):
        run_replicated(q, {**data, "a": [KillReplica("entry.1", 0), *data["a"]]}, k=2, seed=1)
    with pytest.raises(ValueError, match=r"parallelism\['entry'\] must be an integer >= 1"):
        run_replicated(q, data, k=2, parallelism={"entry": 0})
    # (the simulator runs entry partitions: tests/sim/test_sim_entry_app_partitions.py)


@pytest.mark.parametrize("seed", range(6))
def test_any_chunking_cut_between_partitions_gives_the_unpartitioned_ids_lateness_and_punctuations(seed):
    """EntrySplit alone: per tuple, the partitions emit what one entry point emits (ids, late and
    malformed rows), and the last punctuation of every partition is the unpartitioned one."""
    rng = np.random.default_rng(seed)
    s = Schema({"x": "i8"})
    n = 300
    recs = [{"ts": int(t), "x": int(i)} for i, t in enumerate(np.arange(n) * 10 + rng.integers(-60, 20, n))]
    for i in rng.choice(n, 5, replace=False):
        recs[int(i)] = {"ts": int(recs[int(i)]["ts"]) + 500, "x": "bad"}
    cuts = sorted(set(rng.integers(1, n, 30).tolist()))
    chunks = [recs[a:b] for a, b in zip([0, *cuts], [*cuts, n])]
    chunks.insert(len(chunks) // 2, Punctuation(int(recs[n // 2]["ts"]) + 100))

    def entry():
        return EntryLogic("src", s, punctuate_every=50, max_disorder=20, on_malformed="dead_letter")

    one = entry()
    whole = [it for c in chunks for it in one.push(c)]
    p = int(rng.integers(2, 5))
    items, logics, _ = partition_streams(entry, chunks, p)
    got = np.concatenate([it for part in items for it in part if isinstance(it, np.ndarray)])
    assert_same_output(np.concatenate([it for it in whole if isinstance(it, np.ndarray)]), got)
    assert sum(e.late_count for e in logics) == one.late_count > 0
    assert sum(e.malformed_count for e in logics) == one.malformed_count == 5
    puncts = [it.p for it in whole if isinstance(it, Punctuation)]
    for part in items:  # every partition emits the unpartitioned punctuations, in order, then the end
        ps = [it.p for it in part if isinstance(it, Punctuation)]
        assert ps[-1] == END and ps[:-1] == sorted(ps[:-1]) and set(ps[:-1]) <= set(puncts)
        assert ps[-2] == puncts[-1]


def test_a_chunk_read_elsewhere_is_counted_from_its_row_count_and_largest_time():
    """A ChunkRef (rows in Ray's object store) moves the shadow by its meta alone."""
    from replistream.sources import ChunkRef

    split = EntrySplit(EntryLogic("src", Schema({"x": "i8"}), punctuate_every=10), 2)
    sent = split.route(ChunkRef(ref=None, n=5, tmin=1, tmax=23))
    assert [(p, st) for p, _, st in sent][:1] == [(0, split.shadow.position().__class__(0, -2**63, -2**63))]
    assert [(p, it) for p, it, _ in sent[1:]] == [(1, Punctuation(19))]
    (p, _, st), = split.route(ChunkRef(ref=None, n=2, tmin=24, tmax=25))
    assert (p, st.seq, st.max_ts, st.punct) == (1, 5, 23, 19)


def test_a_source_rate_read_from_metrics_adds_up_the_entry_partitions_shares():
    """Placement statistics from a run with entry partitions: each partition carries its chunks'
    tuples, so a source's rate is the sum over the partitions (not one partition's share)."""
    from replistream.placement.model import QueryStats
    from replistream.workloads import fig1_query

    m = {"actors": {"entry.0#0": {"links": [{"to": "loads#0", "port": 0, "tuples": 10}]},
                    "entry.0#1": {"links": [{"to": "loads#0", "port": 0, "tuples": 10}]},
                    "entry.1#0": {"links": [{"to": "loads#0", "port": 0, "tuples": 20}]},
                    "loads#0": {"links": [{"to": "correlate#0", "port": 0, "tuples": 30}], "busy_seconds": 3.0}}}
    st = QueryStats.from_metrics(fig1_query(1), m, 10.0, row_bytes=False)
    assert st.rates["load_0"] == 3.0

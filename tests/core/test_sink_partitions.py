"""Partitioned applications without Ray (issue #41 point 4): ``parallelism={app: p}`` on the
in-process engine runs an application as ``p`` partitions x ``k`` replicas (``out.P#R``); run()
is the union of the partitions' output, exact against the reference; a ParquetSink writes one
file per cell and partition (``part-<cell>-p<P>.parquet``), the same bytes from either replica
of a partition, and is complete only when every partition has finished."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from replistream import END, ParquetSink, Query, QueryError, seconds
from replistream.engines.inprocess import InProcessEngine
from replistream.partition import check_parallelism
from replistream.sinks import MARKER, RUN_RECORD, SinkWriter
from replistream.sources import KillReplica, Rescale, StopReplica
from replistream.testing import assert_same_output, run_reference, run_replicated


def case(n=400, seed=0):
    q = Query("apps")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(2), by="k", aggs={"n": "count", "t": ("v", "sum")}, name="w").sink("out")
    s.filter(lambda b: b["v"] > -0.5, name="f").sink("pos")
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(20), n))
    k, v = rng.integers(0, 30, n), rng.normal(size=n)
    data = {"s": [{"ts": ts[a:a + 9], "k": k[a:a + 9], "v": v[a:a + 9]} for a in range(0, n, 9)]}
    return q.build(), data


def files(path):
    return {n: open(os.path.join(path, n), "rb").read() for n in sorted(os.listdir(path)) if n != RUN_RECORD}


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("upstream", [False, True])
def test_partitioned_applications_equal_the_reference(tmp_path, p, k, upstream):
    q, data = case()
    ref = run_reference(q, data)
    par = {"out": p, "pos": p, **({"w": 2, "f": 3, "entry": 2} if upstream else {})}
    sink = ParquetSink(str(tmp_path / "pos"), every=seconds(3))
    eng = InProcessEngine(q, k=k, seed=p + k, crash=k > 1, parallelism=par, sinks={"pos": sink})
    got = eng.run(data)
    assert got.complete
    assert [r.label for r in eng.groups["out"]] == [f"out.{i}#{j}" for i in range(p) for j in range(k)]
    assert_same_output(ref.outputs["out"], got.outputs["out"])
    assert len(got.outputs["pos"]) == 0  # keep=False: the tuples are in the files
    assert sink.complete() and sink.manifest()["partitions"] == p
    assert_same_output(ref.outputs["pos"], sink.read())
    names = [n for n in os.listdir(sink.path) if n.endswith(".parquet")]
    assert {n.rsplit("-p", 1)[1][:-len(".parquet")] for n in names} == {f"{i:04d}" for i in range(p)}
    assert sorted(n for n in os.listdir(sink.path) if n.startswith(MARKER)) == \
        [MARKER] + [f"{MARKER}-p{i:04d}" for i in range(p)]
    assert got.stats["sinks"]["pos"]["rows"] == len(ref.outputs["pos"])
    # every replica of a partition took the same share: its writer lists the same files
    for i in range(p):
        listed = [eng.writers[f"pos.{i}#{j}"].written for j in range(k)]
        assert all(w == listed[0] for w in listed)


@pytest.mark.parametrize("event", [KillReplica("out.1", 0), StopReplica("out.1", 0)])
def test_a_lost_replica_of_an_application_partition_loses_nothing(tmp_path, event):
    q, data = case()
    ref = run_reference(q, data)
    chunks = list(data["s"])
    kill = [KillReplica("pos.1", 0) if isinstance(event, KillReplica) else StopReplica("pos.1", 0)]
    inputs = {"s": chunks[:10] + [event] + kill + chunks[10:]}
    sink = ParquetSink(str(tmp_path / "pos"), every=seconds(3), keep=True)
    got = run_replicated(q, inputs, k=2, seed=5, parallelism={"out": 2, "pos": 2}, sinks={"pos": sink})
    h = got.stats["harness"]
    assert {"out.1#0", "pos.1#0"} <= set(h.crashed if isinstance(event, KillReplica) else h.stopped)
    assert got.complete
    assert_same_output(ref.outputs["out"], got.outputs["out"])
    assert_same_output(ref.outputs["pos"], got.outputs["pos"])
    assert_same_output(ref.outputs["pos"], sink.read())


def test_two_writers_of_one_partition_write_the_same_bytes(tmp_path):
    rows = np.array([(t, 1000 + t, float(t % 7)) for t in range(60)], dtype=[("ts", "i8"), ("id", "u8"), ("v", "f8")])
    rng = np.random.default_rng(3)
    one, two, alone = (str(tmp_path / n) for n in ("one", "two", "alone"))
    for d in (one, two, alone):
        os.makedirs(d)
    a = SinkWriter(ParquetSink(one, every=20), "app", "app.1#0", partition=1, partitions=2)
    b = SinkWriter(ParquetSink(two, every=20), "app", "app.1#1", partition=1, partitions=2)
    a.add(rows)
    for piece in np.array_split(rows[rng.permutation(len(rows))], 5):  # another arrival order and batching
        b.add(piece)
    for w in (a, b):
        assert w.punctuate(39) == [0, 1]
        w.punctuate(END)
    assert files(one) == files(two)
    assert sorted(files(one)) == ["_SUCCESS-p0001", "part-0000000000000-p0001.parquet",
                                  "part-0000000000001-p0001.parquet", "part-0000000000002-p0001.parquet"]
    # in one folder the first link wins: the second writer finds every file there, and the bytes are its own
    c = SinkWriter(ParquetSink(one, every=20), "app", "app.1#1", partition=1, partitions=2)
    c.add(rows[::-1])
    c.punctuate(END)
    assert c.won == 0 and c.stats()["complete"] and files(one) == files(two)


def test_complete_only_when_every_partition_finished(tmp_path):
    sink = ParquetSink(str(tmp_path / "out"), every=10)
    sink.prepare()
    dt = [("ts", "i8"), ("id", "u8"), ("v", "f8")]
    writers = [SinkWriter(sink, "app", f"app.{i}#0", partition=i, partitions=3) for i in range(3)]
    for i, w in enumerate(writers):
        w.add(np.array([(t, 10 * t + i, float(i)) for t in range(i, 30, 3)], dtype=dt))
    for w in writers[:2]:
        w.punctuate(END)
    assert not sink.complete()
    assert not os.path.exists(os.path.join(sink.path, MARKER))
    with pytest.raises(FileNotFoundError, match="no _SUCCESS marker"):
        sink.read()
    assert len(sink.read(complete=False)) == 20
    writers[2].punctuate(END)
    assert sink.complete()
    m = sink.manifest()
    assert m["partitions"] == 3 and m["rows"] == 30 and len(m["files"]) == 9
    assert json.load(open(os.path.join(sink.path, MARKER))) == m
    out = sink.read()
    assert sorted(out["id"].tolist()) == sorted(10 * t + t % 3 for t in range(30))
    # without the merged marker (its writer died after linking its partition's), every partition's markers say it
    os.unlink(os.path.join(sink.path, MARKER))
    assert sink.complete() and sink.manifest() == m and len(sink.read()) == 30
    # read() checks every partition's files against the markers
    victim = sorted(n for n in os.listdir(sink.path) if n.endswith("-p0002.parquet"))[0]
    os.unlink(os.path.join(sink.path, victim))
    with pytest.raises(ValueError, match=f"{victim} is listed by the _SUCCESS marker"):
        sink.read()


def test_an_unpartitioned_run_keeps_its_layout_and_bytes(tmp_path):
    q, data = case()
    ref = run_reference(q, data).outputs["pos"]
    by_engine = ParquetSink(str(tmp_path / "engine"), every=seconds(3))
    run_replicated(q, data, k=2, seed=1, parallelism={"out": 2}, sinks={"pos": by_engine})
    by_reference = ParquetSink(str(tmp_path / "reference"), every=seconds(3))
    by_reference.write_result(q, "pos", ref)
    assert files(by_engine.path) == files(by_reference.path)
    assert all(n == MARKER or n.count("-") == 1 for n in files(by_engine.path))  # part-<cell>.parquet
    assert "partitions" not in by_engine.manifest()


def test_replace_replaces_a_partitioned_run_and_keeps_foreign_files(tmp_path):
    q, data = case()
    ref = run_reference(q, data).outputs["pos"]
    path = str(tmp_path / "pos")
    run_replicated(q, data, k=1, parallelism={"pos": 3}, sinks={"pos": ParquetSink(path, every=seconds(3))})
    assert sum(n.startswith(f"{MARKER}-p") for n in os.listdir(path)) == 3
    with pytest.raises(FileExistsError, match="mode='replace'"):
        run_replicated(q, data, k=1, parallelism={"pos": 2}, sinks={"pos": ParquetSink(path, every=seconds(3))})
    again = ParquetSink(path, every=seconds(5), mode="replace")  # partitioned -> 2 partitions
    run_replicated(q, data, k=1, parallelism={"pos": 2}, sinks={"pos": again})
    assert set(os.listdir(path)) == set(again.manifest()["files"]) | {MARKER, RUN_RECORD, f"{MARKER}-p0000",
                                                                     f"{MARKER}-p0001"}
    assert_same_output(ref, again.read())
    # an unfinished partitioned run (one partition's marker, no _SUCCESS) is replaced too
    os.unlink(os.path.join(path, MARKER))
    os.unlink(os.path.join(path, f"{MARKER}-p0001"))
    flat = ParquetSink(path, every=seconds(3), mode="replace")
    run_replicated(q, data, k=1, sinks={"pos": flat})
    assert set(os.listdir(path)) == set(flat.manifest()["files"]) | {MARKER, RUN_RECORD}
    # a foreign file among a partitioned run's is never deleted
    run_replicated(q, data, k=1, parallelism={"pos": 2},
                   sinks={"pos": ParquetSink(path, every=seconds(3), mode="replace")})
    open(os.path.join(path, "notes.txt"), "w").write("mine")
    before = sorted(os.listdir(path))
    with pytest.raises(FileExistsError, match="notes.txt"):
        ParquetSink(path, mode="replace").prepare()
    assert sorted(os.listdir(path)) == before


def test_what_cannot_take_partitioned_applications_says_so():
    q, data = case(n=50)
    with pytest.raises(QueryError, match=r"'out' is an application, which is not partitioned here .*deploy\(") as e:
        check_parallelism(q, {"out": 2})
    assert "\n" not in str(e.value)
    assert check_parallelism(q, {"out": 2}, applications=True) == {"out": 2}
    # (the simulator runs partitioned applications: tests/sim/test_sim_entry_app_partitions.py)
    with pytest.raises(QueryError, match="'out' is not an operator"):
        run_replicated(q, {"s": data["s"] + [Rescale("out", 3)]}, k=1, parallelism={"out": 2})
    with pytest.raises(ValueError, match="exactly k=2 distinct servers"):
        InProcessEngine(q, k=2, parallelism={"out": 2},
                        placement={"entry": ["a", "b"], "w": ["a", "b"], "f": ["a", "b"], "out": ["a"], "pos": ["a"]})

"""What a ParquetSink folder holds and how it is read back (#40 point 6, #44 point 6), without Ray:
``mode="replace"`` deletes only an earlier run's files, commits are fsynced before they are linked,
``read()`` checks the marker's row counts, and the files read back like a RunResult."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replistream import END, Query, ParquetSink, run_reference
from replistream.sinks import MARKER, RUN_RECORD, SinkWriter


def finished(path, every=100, n=30):
    q = Query("sinks"); s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=10)
    s.filter(lambda b: b["v"] > 0).sink("pos")
    q = q.build()
    data = {"s": [{"ts": np.arange(0, n * 10, 10), "k": np.arange(n) % 3, "v": np.linspace(-1, 1, n)}]}
    ref = run_reference(q, data).outputs["pos"]
    sink = ParquetSink(str(path), every=every, mode="replace")
    sink.write_result(q, "pos", ref)
    return sink, ref


@pytest.mark.parametrize("foreign", ["part-0.parquet", "part-00000-3f2a-c000.snappy.parquet", "notes.txt"])
def test_replace_refuses_a_folder_holding_other_files(tmp_path, foreign):
    sink, _ = finished(tmp_path / "out")
    other = tmp_path / "out" / foreign
    pq.write_table(pa.table({"x": [1]}), str(other))
    before = sorted(os.listdir(sink.path))
    with pytest.raises(FileExistsError) as e:
        ParquetSink(sink.path, mode="replace").prepare()
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and os.path.abspath(sink.path) in msg and foreign in msg
    assert "move them away or choose an empty folder" in msg
    assert sorted(os.listdir(sink.path)) == before  # nothing deleted


def test_replace_refuses_a_dataset_with_a_spark_marker(tmp_path):
    d = tmp_path / "spark"
    d.mkdir()
    pq.write_table(pa.table({"x": [1]}), str(d / "part-0000000000001.parquet"))  # our name pattern, not our run
    (d / MARKER).write_text("")  # Spark's empty _SUCCESS
    with pytest.raises(FileExistsError, match="2 file"):
        ParquetSink(str(d), mode="replace").prepare()
    assert sorted(os.listdir(d)) == ["_SUCCESS", "part-0000000000001.parquet"]


def test_replace_deletes_the_earlier_run_finished_or_not(tmp_path):
    sink, ref = finished(tmp_path / "out")
    listed = set(sink.manifest()["files"])
    assert set(os.listdir(sink.path)) == listed | {MARKER, RUN_RECORD}
    again, _ = finished(tmp_path / "out", every=50)  # a finished run replaced
    assert set(os.listdir(again.path)) == set(again.manifest()["files"]) | {MARKER, RUN_RECORD}
    # an unfinished run: committed cells and a replica's hidden file, no marker; its run record says they are its
    os.unlink(os.path.join(again.path, MARKER))
    open(os.path.join(again.path, ".pos-1-part-0000000000009.parquet.tmp"), "w").close()
    third = ParquetSink(again.path, mode="replace")
    third.prepare()
    assert os.listdir(third.path) == [RUN_RECORD]
    assert json.load(open(os.path.join(third.path, RUN_RECORD)))["run"] == third.run_id != again.run_id


def test_read_checks_the_markers_row_counts(tmp_path):
    sink, ref = finished(tmp_path / "out")
    name = sorted(sink.manifest()["files"])[0]
    path = os.path.join(sink.path, name)
    t = pq.read_table(path)
    pq.write_table(t.slice(0, t.num_rows - 1), path)  # a row lost after the run
    with pytest.raises(ValueError, match=rf"{path} holds {t.num_rows - 1} rows but the _SUCCESS marker lists "
                                         rf"{t.num_rows}"):
        sink.read()
    os.unlink(path)
    with pytest.raises(ValueError, match=rf"{path} is listed by the _SUCCESS marker .* but missing"):
        sink.read()
    assert len(sink.read(complete=False)) < len(ref)  # what is there, unchecked, on request


def test_commits_are_fsynced_before_the_link_and_the_folder_after(tmp_path, monkeypatch):
    sink = ParquetSink(str(tmp_path / "out"), every=10)
    sink.prepare()
    calls = []
    real_fsync, real_link = os.fsync, os.link
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "link", lambda a, b: (calls.append(("link", b)), real_link(a, b))[1])
    w = SinkWriter(sink, "app", "app#0")
    w.add(np.array([(3, 1.0)], dtype=[("ts", "i8"), ("v", "f8")]))
    w.punctuate(END)
    final = os.path.join(sink.path, "part-0000000000000.parquet")
    tmp = os.path.join(sink.path, ".app-0-part-0000000000000.parquet.tmp")
    i = calls.index(("link", final))
    assert calls[i - 1] == ("fsync", tmp)  # the file's bytes first
    assert calls[i + 1] == ("fsync", os.path.realpath(sink.path))  # then the folder holding its name
    assert ("link", os.path.join(sink.path, MARKER)) in calls and calls[-1] == ("fsync", os.path.realpath(sink.path))


def test_the_files_read_back_like_a_run_result(tmp_path):
    sink, ref = finished(tmp_path / "out", n=40)
    from replistream.engines.result import RunResult

    want = RunResult({"pos": ref}, {"pos": END})
    assert sink.show(n=5) == want.show("pos", n=5)
    assert "ts (s)" in sink.show() and "id" not in sink.show().splitlines()[0]
    df = sink.to_pandas()
    assert list(df.columns) == list(want.to_pandas("pos").columns)
    assert df.sort_values(["ts", "id"]).reset_index(drop=True).equals(
        want.to_pandas("pos").sort_values(["ts", "id"]).reset_index(drop=True))
    assert len(sink) == len(ref)


def test_a_sink_prepared_twice_for_one_run_stays_ready(tmp_path):
    """A detached deploy() prepares its sinks in the script, then its host prepares the same sinks
    (pickled, with their run id) again: that is not a used folder."""
    import pickle

    sink = ParquetSink(str(tmp_path / "out"))
    sink.prepare()
    again = pickle.loads(pickle.dumps(sink))
    again.prepare()
    assert again.run_id == sink.run_id and os.listdir(sink.path) == [RUN_RECORD]
    with pytest.raises(FileExistsError, match="is not empty"):
        ParquetSink(sink.path).prepare()  # another sink (another run) is refused


@pytest.mark.parametrize("seed", range(6))
def test_canonical_order_is_the_sort_by_every_field(seed):
    """The (ts, id) shortcut gives the very order of a sort by every field, ties on (ts, id) included
    (issue #42): every replica must write the same bytes."""
    from replistream.sinks import canonical_order

    rng = np.random.default_rng(seed)
    n = 2000
    rows = np.zeros(n, dtype=[("ts", "i8"), ("id", "u8"), ("k", "i8"), ("v", "f8")])
    rows["ts"] = rng.integers(0, 50, n)
    # ids spread, or few (many (ts, id) ties), or below 2**32 (ties on the ids' top bits only)
    rows["id"] = rng.integers(0, (1 << 60, 4, 1 << 20)[seed % 3], n)
    rows["k"] = rng.integers(0, 3, n)
    rows["v"] = rng.random(n)
    want = np.lexsort([rows[f] for f in reversed(rows.dtype.names)])
    got = canonical_order(rows)
    assert rows[got].tobytes() == rows[want].tobytes()
    shuffled = rows[rng.permutation(n)]
    assert shuffled[canonical_order(shuffled)].tobytes() == rows[want].tobytes()


def test_a_cell_is_the_same_bytes_whatever_the_arrival_order(tmp_path):
    rng = np.random.default_rng(3)
    n = 3000
    rows = np.zeros(n, dtype=[("ts", "i8"), ("id", "u8"), ("k", "i8"), ("v", "f8")])
    rows["ts"], rows["id"] = rng.integers(0, 100, n), rng.integers(0, 1 << 60, n, dtype=np.uint64)
    rows["k"], rows["v"] = rng.integers(0, 5, n), rng.random(n)
    files = []
    for i, perm in enumerate((np.arange(n), rng.permutation(n))):
        sink = ParquetSink(str(tmp_path / f"out{i}"), every=1000)
        sink.prepare()
        w = SinkWriter(sink, "app", "app#0")
        for part in np.array_split(rows[perm], 7):
            w.add(part)
        w.punctuate(END)
        [name] = [f for f in os.listdir(sink.path) if f.endswith(".parquet")]
        files.append(open(os.path.join(sink.path, name), "rb").read())
    assert files[0] == files[1]

"""File sources read in process (replistream.files.FileSource): schema from the files, checks
before anything runs, rows that cannot be carried dead-lettered, order and ids independent of
chunk size. The Ray path (files read by Ray tasks) is in tests/ray/test_files_runtime.py."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import replistream as rs
from replistream.errors import SchemaError
from replistream.files import FileSource
from replistream.testing import assert_same_output, run_reference, run_replicated


def readings(n, seed, t0=0, nulls=0):
    rng = np.random.default_rng(seed)
    t = t0 + np.sort(rng.integers(0, 1_000_000, n))
    key = rng.integers(0, 5, n)
    cpu = rng.random(n)
    cpu_list = cpu.tolist()
    for i in rng.choice(n, nulls, replace=False) if nulls else []:
        cpu_list[i] = None
    return pa.table({"t": t, "key": key, "cpu": pa.array(cpu_list, pa.float64())})


def write_parts(d, fmt="parquet", parts=3, n=2_000, nulls=0):
    os.makedirs(d, exist_ok=True)
    for i in range(parts):
        tab = readings(n, seed=i, t0=i * 1_000_000, nulls=nulls)
        path = os.path.join(d, f"part-{i}.{ {'parquet': 'parquet', 'csv': 'csv', 'feather': 'feather'}[fmt] }")
        {"parquet": pq.write_table, "csv": pacsv.write_csv, "feather": feather.write_feather}[fmt](tab, path)
    return d


def query(src):
    q = rs.Query("files")
    s = src.declare(q, "load", punctuate_every=100_000)
    s.window(size=200_000, by="key", aggs={"n": "count", "avg": ("cpu", "mean")}).sink("per_key")
    return q.build()


def expected(tables):
    t = pa.concat_tables(tables)
    ok = np.asarray(t.column("cpu").is_valid())
    return int(ok.sum()), int((~ok).sum())


@pytest.mark.parametrize("fmt", ["parquet", "csv", "feather"])
def test_every_format_reads_whole_and_exact(tmp_path, fmt):
    d = write_parts(str(tmp_path / fmt), fmt, nulls=7)
    src = FileSource(d, time="t")
    assert src.format == fmt and src.schema() == rs.Schema({"key": "i8", "cpu": "f8"})
    q = query(src)
    res = run_reference(q, {"load": src})
    good, bad = expected([readings(2_000, seed=i, t0=i * 1_000_000, nulls=7) for i in range(3)])
    assert int(res.outputs["per_key"]["n"].sum()) == good
    letters = [d for d in res.dead_letters if "null" in d.reason]
    assert sum(d.count for d in letters) == bad == 21
    assert src.stats["files"] == 3 and src.stats["rows"] == 6_000
    assert src.files_read == sorted(src.files_read)


def test_chunk_size_changes_nothing_and_replicated_run_matches(tmp_path):
    d = write_parts(str(tmp_path / "p"), nulls=3)
    whole = run_reference(query(FileSource(d, time="t")), {"load": FileSource(d, time="t")})
    small = FileSource(d, time="t", chunk_size=333)
    cut = run_reference(query(small), {"load": small})
    assert small.stats["chunks"] >= 18
    assert_same_output(whole.outputs["per_key"], cut.outputs["per_key"])
    rep = run_replicated(query(small), {"load": small}, k=2, seed=1)
    assert_same_output(whole.outputs["per_key"], rep.outputs["per_key"])


def test_columns_renamed_and_chosen(tmp_path):
    d = write_parts(str(tmp_path / "p"), parts=1)
    src = FileSource(d, time="t", columns={"load": "cpu"})
    assert src.schema() == rs.Schema({"load": "f8"})


def test_mistakes_are_named_before_anything_runs(tmp_path):
    d = write_parts(str(tmp_path / "p"), parts=1)
    with pytest.raises(SchemaError, match="event-time column 'when'"):
        FileSource(d, time="when")
    with pytest.raises(SchemaError, match=r"column\(s\) \['gpu'\] not in the files"):
        FileSource(d, time="t", columns=["gpu"])
    with pytest.raises(SchemaError, match="no such file or directory"):
        FileSource(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="idle_timeout"):
        FileSource(d, time="t", watch=True)
    with pytest.raises(ValueError, match="chunk_size"):
        FileSource(d, time="t", chunk_size=0)
    src = FileSource(d, time="t")
    with pytest.raises(SchemaError, match="column 'cpu' has type double but field 'cpu' is bool"):
        src.bind("load", rs.Schema({"key": "i8", "cpu": "?"}))
    with pytest.raises(SchemaError, match=r"needs field\(s\) \['rack'\]"):
        src.bind("load", rs.Schema({"key": "i8", "rack": "i4"}))
    txt = tmp_path / "t"
    txt.mkdir()
    pacsv.write_csv(pa.table({"t": ["soon", "later"], "x": [1, 2]}), str(txt / "a.csv"))
    with pytest.raises(SchemaError, match="must be a timestamp, date or number"):
        FileSource(str(txt), time="t")


def test_a_corrupt_file_is_named(tmp_path):
    d = write_parts(str(tmp_path / "p"), parts=2)
    with open(os.path.join(d, "part-1.parquet"), "r+b") as f:
        f.seek(100)
        f.write(b"\0" * 400)
    src = FileSource(d, time="t")
    with pytest.raises(SchemaError, match="part-1.parquet"):
        run_reference(query(src), {"load": src})


def test_timestamps_and_dates_become_microseconds(tmp_path):
    import datetime as dt

    base = dt.datetime(2026, 11, 24, 12, 0, 0)
    tab = pa.table({"when": pa.array([base, base + dt.timedelta(seconds=1)], pa.timestamp("ms")),
                    "x": [1, 2]})
    pq.write_table(tab, str(tmp_path / "a.parquet"))
    src = FileSource(str(tmp_path / "a.parquet"), time="when")
    q = rs.Query("t")
    src.declare(q, "s").sink("out")
    out = run_reference(q.build(), {"s": src}).outputs["out"]
    epoch_us = int((base - dt.datetime(1970, 1, 1)).total_seconds() * 1e6)
    assert out["ts"].tolist() == [epoch_us, epoch_us + 1_000_000]

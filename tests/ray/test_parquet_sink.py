"""Issue #29 point 4 on Ray: an application's replicas write its ParquetSink themselves: one file
per cell of event time, committed atomically, identical whichever replica writes it (byte for
byte), one completion marker; a replica killed mid-run leaves the output exact; a re-run into a
used folder is refused or replaces, never mixes (replistream/sinks.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from replistream import END, ParquetSink, deploy, seconds
from replistream.sinks import MARKER, RUN_RECORD, SinkWriter
from replistream.sources import KillReplica, inject_at
from replistream.testing import assert_same_output, run_reference

from test_slowness import SERVERS, inputs, query  # tests/ray is on sys.path (rootdir import mode)

pytestmark = pytest.mark.usefixtures("ray_session")


def files(path):
    """The folder's files but the run record (a run id of its own per run)."""
    return {n: open(os.path.join(path, n), "rb").read() for n in sorted(os.listdir(path)) if n != RUN_RECORD}


def test_two_application_replicas_one_killed_write_the_reference_files(tmp_path):
    q, data = query(), inputs(n=2000, span_s=20)
    ref = run_reference(q, data)
    expected = ParquetSink(str(tmp_path / "expected"), every=seconds(2))
    expected.write_result(q, "out", ref.outputs["out"])
    sink = ParquetSink(str(tmp_path / "out"), every=seconds(2))
    s = inject_at(data["s"], seconds(8), KillReplica("out", 1))  # one of the two writers dies mid-run
    with deploy(q, servers=SERVERS, k=2, app_replicas=2, sinks={"out": sink}) as dep:
        res = dep.run({"s": s}, pace=4.0, timeout=120)
    assert res.complete and len(res.outputs["out"]) == 0  # the tuples are in the files, not in the driver
    assert res.stats["sinks"]["out"]["complete"] and res.stats["sinks"]["out"]["rows"] == len(ref.outputs["out"])
    assert res.stats["handed_off"]["out"] == len(ref.outputs["out"])
    assert_same_output(ref.outputs["out"], sink.read())
    got, want = files(sink.path), files(expected.path)
    assert list(got) == list(want) and MARKER in got  # no half-written or hidden file left by the survivor
    assert got == want  # byte for byte: whichever replica committed a cell, it is the reference's file


def test_a_used_folder_is_refused_or_replaced_never_mixed(tmp_path):
    q, data = query(window=False), inputs(n=600, span_s=6)
    ref = run_reference(q, data)
    path = str(tmp_path / "out")
    with deploy(q, servers=SERVERS, k=2, sinks={"out": ParquetSink(path, every=seconds(1))}) as dep:
        dep.run(data, timeout=120)
    first = files(path)
    with pytest.raises(FileExistsError, match="mode='replace'"):
        deploy(q, servers=SERVERS, k=2, sinks={"out": ParquetSink(path)})
    assert files(path) == first  # refused before anything was written
    with open(os.path.join(path, "notes.txt"), "w") as f:
        f.write("mine")
    with pytest.raises(FileExistsError, match="no run of a ParquetSink wrote"):
        deploy(q, servers=SERVERS, k=2, sinks={"out": ParquetSink(path, mode="replace")})
    os.unlink(os.path.join(path, "notes.txt"))
    sink = ParquetSink(path, every=seconds(3), mode="replace", keep=True)  # another grid: other file names
    with deploy(q, servers=SERVERS, k=2, sinks={"out": sink}) as dep:
        res = dep.run(data, timeout=120)
    assert_same_output(ref.outputs["out"], res.outputs["out"])  # keep=True: in the driver too
    assert_same_output(ref.outputs["out"], sink.read())
    assert sink.manifest()["every"] == seconds(3) and set(files(path)) == {*sink.manifest()["files"], MARKER}


def test_sink_errors_name_the_application_and_the_fix():
    q = query(window=False)
    with pytest.raises(ValueError, match="not an application"):
        deploy(q, servers=SERVERS, k=2, sinks={"nope": ParquetSink("/tmp/x")})
    with pytest.raises(ValueError, match="must be a replistream.ParquetSink"):
        deploy(q, servers=SERVERS, k=2, sinks={"out": "/tmp/x"})
    with pytest.raises(ValueError, match="every must be a positive"):
        ParquetSink("/tmp/x", every=0)


def test_writers_fed_in_different_orders_commit_the_same_bytes(tmp_path):
    rng = np.random.default_rng(4)
    rows = np.zeros(500, dtype=[("ts", "i8"), ("k", "i8"), ("v", "f8")])
    rows["ts"], rows["k"], rows["v"] = np.sort(rng.integers(0, 100, 500)), rng.integers(0, 5, 500), rng.normal(size=500)
    out = {}
    for name, order in (("a", np.arange(500)), ("b", rng.permutation(500))):
        sink = ParquetSink(str(tmp_path / name), every=25)
        sink.prepare()
        w = SinkWriter(sink, "app", f"app#{name}")
        for part in np.array_split(rows[order], 7):
            w.add(part)
        assert w.punctuate(49) == [0, 1]  # cells [0, 25) and [25, 50) are closed
        w.punctuate(END)
        out[name] = files(sink.path)
    assert out["a"] == out["b"] and len(out["a"]) == 5

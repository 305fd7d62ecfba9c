"""Ingest without the driver (issue #16): file sources read by Ray tasks into the object store and
taken by reference by every entry replica; whole arrays cut into chunks by the feeder. Every
run is compared with the reference run over the same files."""
from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import replistream as rs
from replistream.engines.ray import deploy
from replistream.errors import RunFailed
from replistream.files import FileSource
from replistream.sources import ChunkRef, KillReplica, inject_at
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")


def part(i, n=3_000, nulls=5):
    rng = np.random.default_rng(i)
    cpu = rng.random(n).tolist()
    for j in rng.choice(n, nulls, replace=False):
        cpu[j] = None
    return pa.table({"t": i * 1_000_000 + np.sort(rng.integers(0, 1_000_000, n)),
                     "key": rng.integers(0, 20, n), "cpu": pa.array(cpu, pa.float64())})


def query(src):
    q = rs.Query("files")
    s = src.declare(q, "load", punctuate_every=100_000)
    s.window(size=250_000, by="key", aggs={"n": "count", "hi": ("cpu", "max")}).sink("per_key")
    return q.build()


def same(ref, res):
    assert res.complete
    assert_same_output(ref.outputs["per_key"], res.outputs["per_key"])
    null = lambda r: sum(d.count for d in r.dead_letters if "null" in d.reason)  # noqa: E731
    assert null(res) == null(ref) > 0


@pytest.mark.slow
def test_parquet_directory_read_by_ray_tasks_with_an_entry_killed(tmp_path):
    for i in range(4):
        pq.write_table(part(i), str(tmp_path / f"part-{i:02d}.parquet"))
    src = FileSource(str(tmp_path), time="t", chunk_size=1_000)
    q = query(src)
    ref = run_reference(q, {"load": FileSource(str(tmp_path), time="t")})
    src.bind("load", q.schema_of("load"))
    first = next(iter(src))
    assert isinstance(first, ChunkRef) and first.n == 1_000  # rows stay in the object store
    with deploy(q, servers=3, k=2) as dep:
        res = dep.run({"load": inject_at(src, 2_000_000, KillReplica("entry", 0))}, timeout=120)
    same(ref, res)
    assert src.stats["files"] == 4 and src.stats["chunks"] == 12 and src.stats["rows"] == 12_000


@pytest.mark.slow
def test_watched_directory_picks_up_new_files(tmp_path):
    d = tmp_path / "incoming"
    d.mkdir()
    pq.write_table(part(0), str(d / "part-00.parquet"))
    src = FileSource(str(d), time="t", watch=True, poll=0.05, end_marker="_DONE")
    q = query(src)
    dep = deploy(q, servers=3, k=2)
    try:
        dep.feed({"load": src})
        deadline = time.time() + 60  # the first file is served before any other file exists
        while dep.delivered.count("per_key") == 0 and time.time() < deadline:
            dep.poll()
            time.sleep(0.05)
        assert dep.delivered.count("per_key") > 0, "the first file's results waited for a second file"
        for i in range(1, 3):  # each file written under a hidden name, then renamed: never read half-written
            pq.write_table(part(i), str(d / f".part-{i:02d}.tmp"))
            os.rename(d / f".part-{i:02d}.tmp", d / f"part-{i:02d}.parquet")
        (d / "_DONE").touch()
        assert dep.wait(120)
        res = dep.collect()
    finally:
        dep.shutdown()
    assert [os.path.basename(f) for f in src.files_read] == ["part-00.parquet", "part-01.parquet", "part-02.parquet"]
    same(run_reference(q, {"load": src.replay()}), res)


def test_an_unreadable_file_fails_the_run_naming_it(tmp_path):
    pq.write_table(part(0), str(tmp_path / "part-00.parquet"))
    pq.write_table(part(1), str(tmp_path / "part-01.parquet"))
    with open(tmp_path / "part-01.parquet", "r+b") as f:
        f.seek(64)
        f.write(b"\xff" * 512)
    src = FileSource(str(tmp_path), time="t")
    with deploy(query(src), servers=2, k=2) as dep:
        with pytest.raises(RunFailed, match="part-01.parquet"):
            dep.run({"load": src}, timeout=120)


@pytest.mark.slow
def test_a_whole_column_mapping_is_cut_into_chunks():
    rng = np.random.default_rng(4)
    n = 25_000
    cols = {"ts": np.sort(rng.integers(0, 5_000_000, n)), "key": rng.integers(0, 50, n)}
    q = rs.Query("cut")
    s = q.source("s", {"key": "i8"}, punctuate_every=500_000)
    s.window(size=1_000_000, by="key", aggs={"n": "count"}).sink("counts")
    q.build()
    ref = run_reference(q, {"s": cols})
    with deploy(q, servers=2, k=2) as dep:
        res = dep.run({"s": cols}, chunk_size=4_000)
        assert dep.feeder.seqs["s"] == 8  # 7 chunks and the end, not one 25k-row call
    assert_same_output(ref.outputs["counts"], res.outputs["counts"])
    with pytest.raises(ValueError, match="chunk_size"):
        with deploy(q, servers=2, k=1) as dep:
            dep.run({"s": cols}, chunk_size=0)


@pytest.mark.slow
def test_a_paced_chunk_is_cut_to_chunk_ms_of_wall_time():
    """Paced, a chunk leaves in pieces of at most chunk_ms (k x chunk_ms of event time at pace 1),
    each at its last row's time (here 2 s of event time at pace 10 in 4,000-row chunks: uncut, a
    chunk's first rows would wait 200 ms), and each ended by a row that lets a window close;
    the result does not depend on it."""
    from replistream.sources import iter_chunks, paced_pieces, window_close_rule

    rng = np.random.default_rng(8)
    n = 8_000
    cols = {"ts": np.sort(rng.integers(0, 2_000_000, n)), "key": rng.integers(0, 50, n)}
    q = rs.Query("paced_cut")
    s = q.source("s", {"key": "i8"}, punctuate_every=100_000)
    s.window(size=200_000, by="key", aggs={"n": "count"}).sink("counts")
    q.build()
    ref = run_reference(q, {"s": cols})
    pieces = list(paced_pieces(iter_chunks(cols, 4_000), int(10 * 1e3 * 5 * 2), window_close_rule(q.window_grid("s"))))
    with deploy(q, servers=2, k=2) as dep:
        res = dep.run({"s": cols}, pace=10.0, chunk_size=4_000, chunk_ms=5)
        # the cut chunks (k x 5 ms each) and the end; fewer (larger) ones only if the replay fell
        # behind (AdaptiveCut)
        if dep.feeder.cut.max_seen_ms == 10:
            assert dep.feeder.seqs["s"] == len(pieces) + 1 > 2 + 1
            ts0 = int(cols["ts"][0])
            for (wall, src, seq), piece in zip(dep.fed, pieces):  # none leaves before its last row's time
                assert wall >= (int(piece["ts"][-1]) - ts0) / 10e6 - 1e-3, (seq, wall)
        else:
            assert 2 + 1 < dep.feeder.seqs["s"] < len(pieces) + 1
    assert_same_output(ref.outputs["counts"], res.outputs["counts"])
    with deploy(q, servers=2, k=1) as dep:
        with pytest.raises(ValueError, match="chunk_ms"):
            dep.run({"s": cols}, pace=1.0, chunk_ms=0)


def test_deploy_starts_one_file_reader_per_job_and_reads_exactly(tmp_path, monkeypatch):
    """deploy() starts a worker for file reads beside the replicas (issue #42: the first chunk of a
    run waited 1.5 s for a new worker process), once per Ray job and only for a query with a source
    declared from files; runs are exact either way."""
    import replistream.files as files

    submitted = []
    task = files._warm_reader_task()

    class Counting:
        def remote(self):
            submitted.append(1)
            return task.remote()

    monkeypatch.setattr(files, "_WARMED", set())
    monkeypatch.setattr(files, "_warm_reader_task", lambda: Counting())
    pq.write_table(part(0), str(tmp_path / "part-00.parquet"))
    q = query(FileSource(str(tmp_path), time="t"))
    ref = run_reference(q, {"load": FileSource(str(tmp_path), time="t")})
    plain = rs.Query("plain")  # the same source declared by hand: no reader started for it
    plain.source("load", q.schema_of("load"), punctuate_every=100_000).window(
        size=250_000, by="key", aggs={"n": "count", "hi": ("cpu", "max")}).sink("per_key")
    with deploy(plain.build(), servers=3, k=1) as dep:
        same(ref, dep.run({"load": FileSource(str(tmp_path), time="t")}, timeout=120))
    assert not submitted
    for _ in range(2):
        with deploy(q, servers=3, k=1) as dep:
            res = dep.run({"load": FileSource(str(tmp_path), time="t")}, timeout=120)
        same(ref, res)
    assert len(submitted) == 1


def test_a_paced_file_source_is_cut_like_any_chunk_and_stays_exact(tmp_path):
    """Paced, chunks a Ray task read from files (rows with nulls set aside among them) are fetched
    by the feeder and cut into pieces of chunk_ms like any chunk (issue #42: left whole, a 3,000-row
    chunk left at its last row's time and every window closing inside it waited for it); the counts,
    the ids and the dead letters are those of the reference run."""
    for i in range(2):
        pq.write_table(part(i), str(tmp_path / f"part-{i:02d}.parquet"))
    src = lambda: FileSource(str(tmp_path), time="t", chunk_size=3_000)  # noqa: E731
    q = query(src())
    ref = run_reference(q, {"load": src()})
    with deploy(q, servers=2, k=2) as dep:
        res = dep.run({"load": src()}, pace=4.0, chunk_ms=10)
        pieces = dep.feeder.seqs["load"]
    same(ref, res)
    assert pieces > 2 * 2 + 1, f"the two files' chunks were sent whole ({pieces} sends)"
    assert sorted(res.outputs["per_key"]["id"].tolist()) == sorted(ref.outputs["per_key"]["id"].tolist())

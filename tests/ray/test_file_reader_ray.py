"""File reads through a reader actor (engines/ray/reader.py, issue #42): a script joined to a
cluster reads its files in a process the cluster's pool kept warm instead of a Ray task of its own.
The chunks are the tasks' chunks; a reading lost, crashed or stopped in the middle of a file (the
reader actor's or a task's) is ended and replaced by a task that passes over the chunks already
read, so no row is lost or read twice; a file no reading gets through ends the feed naming it."""
from __future__ import annotations

import os
import signal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

import replistream as rs
from replistream import files, reading
from replistream.engines.ray.reader import ReaderActor
from replistream.files import FileSource, read_file

pytestmark = pytest.mark.usefixtures("ray_session")


@ray.remote(num_cpus=0, max_concurrency=4)
class DyingReader:
    """A reader that yields the first ``after`` chunks of a file, then waits for :meth:`die` (the
    test has taken those chunks by then) and its process ends."""

    def __init__(self, after: int):
        import threading

        self.after, self.dying = after, threading.Event()

    def die(self) -> None:
        self.dying.set()

    def read(self, path, fmt, plan, chunk_size):
        for i, (meta, batch) in enumerate(read_file(path, fmt, plan, chunk_size)):
            if i == self.after:
                self.dying.wait(60)
                os._exit(1)
            yield batch
            yield meta


@ray.remote(num_cpus=0, max_retries=0)
def crashing_read(path, fmt, plan, chunk_size, marker, after):
    """files' reading task, except that the first reading (no ``marker`` file yet) gives ``after``
    chunks and then its process ends (``after`` < 0: it hangs before its first chunk, every time)."""
    import time

    first = not os.path.exists(marker)
    open(marker, "a").close()
    for i, (meta, batch) in enumerate(read_file(path, fmt, plan, chunk_size)):
        if after < 0:
            time.sleep(3600)
        if first and i == after:
            os._exit(1)
        yield batch
        yield meta


def write_parts(folder, parts=3, n=2_500):
    for i in range(parts):
        rng = np.random.default_rng(i)
        pq.write_table(pa.table({"t": i * 1_000_000 + np.arange(n) * 7, "key": rng.integers(0, 9, n),
                                 "x": rng.random(n)}), str(folder / f"part-{i:02d}.parquet"))


def rows(src, remote: bool, at=None):
    """Every row ``src`` gives (read here, or by reference through Ray), and its chunk count;
    ``at``: ``(i, f)``, call ``f()`` once ``i`` chunks were taken."""
    if remote:
        q = rs.Query("r")
        src.declare(q, "s").sink("out")
        src.bind("s", q.build().schema_of("s"))
    got, chunks = [], iter(src)
    while True:
        if at is not None and len(got) == at[0]:
            at[1]()  # before the next chunk is asked for
        c = next(chunks, None)
        if c is None:
            break
        got.append(ray.get(c.ref, timeout=60) if remote else c)
    data = np.concatenate([b.data for b in got])
    return data[["ts", "key", "x"]].tolist(), len(got)


@pytest.fixture
def no_reader():
    files.use_reader(None)
    yield
    files.use_reader(None)


def test_a_reader_actor_gives_the_chunks_a_task_gives(tmp_path, no_reader):
    write_parts(tmp_path)
    want, n = rows(FileSource(str(tmp_path), time="t", chunk_size=1_000), remote=False)
    reader = ReaderActor.remote()
    try:
        assert ray.get(reader.preload.remote(), timeout=120) > 0
        files.use_reader(reader)
        got, m = rows(FileSource(str(tmp_path), time="t", chunk_size=1_000), remote=True)
        assert files.reader() is reader  # it read every file: still in use
    finally:
        ray.kill(reader)
    assert (got, m) == (want, n) and n == 9


@pytest.mark.parametrize("after", [0, 2])
def test_a_reader_lost_mid_file_is_replaced_by_a_task_that_skips_what_was_read(tmp_path, no_reader, after):
    write_parts(tmp_path)
    want, n = rows(FileSource(str(tmp_path), time="t", chunk_size=1_000), remote=False)
    reader = DyingReader.remote(after)
    files.use_reader(reader)
    # it dies at chunk `after` of the first file, once this side has taken the ones before
    got, m = rows(FileSource(str(tmp_path), time="t", chunk_size=1_000), remote=True,
                  at=(after, lambda: reader.die.remote()))  # (its answer may never come: not awaited)
    assert files.reader() is None  # lost: the tasks read from then on
    assert (got, m) == (want, n)  # every row once, in order


def test_a_reader_that_hangs_is_ended_and_a_task_reads_the_file(tmp_path, no_reader, monkeypatch):
    """No chunk within reading.READ_TIMEOUT_S: the reading is presumed stopped, the reader actor is
    ended and a task reads the file; every row once, in order."""
    write_parts(tmp_path, parts=1)
    want, n = rows(FileSource(str(tmp_path), time="t", chunk_size=1_000), remote=False)
    monkeypatch.setattr(reading, "READ_TIMEOUT_S", 1.0)
    reader = DyingReader.remote(0)  # it waits for die() before its first chunk: it hangs
    files.use_reader(reader)
    try:
        got, m = rows(FileSource(str(tmp_path), time="t", chunk_size=1_000), remote=True)
        assert files.reader() is None
        with pytest.raises(ray.exceptions.RayActorError):  # ended, not left waiting
            ray.get(reader.die.remote(), timeout=60)
    finally:
        ray.kill(reader)
    assert (got, m) == (want, n)


def test_a_stopped_reader_process_is_masked_like_a_crashed_one(tmp_path, no_reader, monkeypatch):
    """The reader actor's process stopped (SIGSTOP) after two chunks of the first of three files: the
    file it reads next gives nothing, its process is killed and a task reads that file instead."""
    write_parts(tmp_path)
    want, n = rows(FileSource(str(tmp_path), time="t", chunk_size=1_000), remote=False)
    monkeypatch.setattr(reading, "READ_TIMEOUT_S", 1.0)
    reader = ReaderActor.remote()
    pid = ray.get(reader.preload.remote(), timeout=120)
    files.use_reader(reader)
    try:
        got, m = rows(FileSource(str(tmp_path), time="t", chunk_size=1_000), remote=True,
                      at=(2, lambda: os.kill(pid, signal.SIGSTOP)))
        assert files.reader() is None
    finally:
        ray.kill(reader)
    assert (got, m) == (want, n) and n == 9


def test_a_deployment_fed_through_a_stopped_reader_gives_the_reference_output(tmp_path, no_reader, monkeypatch):
    """The whole path: a deployment whose file reader's process is stopped (SIGSTOP) before the run
    reads every file through tasks instead, and its output equals the reference run's."""
    from replistream.engines.ray import deploy
    from replistream.testing import assert_same_output, run_reference

    write_parts(tmp_path)
    monkeypatch.setattr(reading, "READ_TIMEOUT_S", 1.0)

    def query():
        q = rs.Query("stopped_reader")
        s = FileSource(str(tmp_path), time="t", chunk_size=1_000).declare(q, "s", punctuate_every=100_000)
        s.window(size=250_000, by="key", aggs={"n": "count", "hi": ("x", "max")}).sink("per_key")
        return q.build()

    reader = ReaderActor.remote()
    pid = ray.get(reader.preload.remote(), timeout=120)
    os.kill(pid, signal.SIGSTOP)
    files.use_reader(reader)
    try:
        with deploy(query(), servers=2, k=1) as dep:
            got = dep.run({"s": FileSource(str(tmp_path), time="t", chunk_size=1_000)}, timeout=120)
        assert files.reader() is None  # given up on, and not used again
    finally:
        ray.kill(reader)
    assert got.complete
    ref = run_reference(query(), {"s": FileSource(str(tmp_path), time="t", chunk_size=1_000)})
    assert len(ref.outputs["per_key"]) > 0
    assert_same_output(ref.outputs["per_key"], got.outputs["per_key"])


@pytest.mark.parametrize("after", [0, 2])
def test_a_reading_task_whose_process_dies_is_read_again(tmp_path, no_reader, monkeypatch, after):
    """A task's process dies after ``after`` chunks of a file (as if killed): a new task reads the
    file and passes over the chunks already fed; every row once."""
    write_parts(tmp_path, parts=2)
    want, n = rows(FileSource(str(tmp_path), time="t", chunk_size=1_000), remote=False)
    marker = str(tmp_path / "_read_once")
    monkeypatch.setattr(files, "_TASK", DyingTask(crashing_read, marker, after))
    got, m = rows(FileSource(str(tmp_path), time="t", chunk_size=1_000), remote=True)
    assert (got, m) == (want, n) and n == 6


@pytest.mark.parametrize("deadline", ["module", "source"])
def test_a_file_no_reading_gets_through_ends_the_feed_naming_it(tmp_path, no_reader, monkeypatch, deadline):
    """Every reading of the file hangs: after reading.READ_ATTEMPTS of them, a loud error naming the
    source, the file, the chunk not fed and why, not a feed that waits for ever. The deadline is
    reading.READ_TIMEOUT_S, or the source's own (``FileSource(read_timeout_s=...)``: the module's
    15 s left as it is, the error names the source's 0.5 s)."""
    write_parts(tmp_path, parts=1)
    if deadline == "module":
        monkeypatch.setattr(reading, "READ_TIMEOUT_S", 1.0)
    monkeypatch.setattr(reading, "READ_ATTEMPTS", 2)
    monkeypatch.setattr(files, "_TASK", DyingTask(crashing_read, str(tmp_path / "_m"), -1))
    s = "1" if deadline == "module" else "0.5"
    with pytest.raises(TimeoutError, match=rf"source 's': reading .*part-00\.parquet failed 2 times in a row before "
                                           rf"its chunk 0 \(gave no chunk within {s} s; gave no chunk within {s} s"):
        rows(FileSource(str(tmp_path), time="t", chunk_size=1_000,
                        read_timeout_s=None if deadline == "module" else 0.5), remote=True)


@pytest.mark.parametrize("bad", [0, -1.0, True, "15"])
def test_a_read_deadline_that_is_not_a_positive_number_is_refused(tmp_path, bad):
    write_parts(tmp_path, parts=1)
    with pytest.raises(ValueError, match="read_timeout_s must be a number of seconds > 0"):
        FileSource(str(tmp_path), time="t", read_timeout_s=bad)


class DyingTask:
    """Stands for files' reading task: ``.options(...).remote(path, fmt, plan, chunk_size)`` runs
    ``fn`` with the test's extra arguments."""

    def __init__(self, fn, *extra):
        self.fn, self.extra, self.opts = fn, extra, {}

    def options(self, **opts):
        self.opts = opts
        return self

    def remote(self, *args):
        return self.fn.options(**self.opts).remote(*args, *self.extra)

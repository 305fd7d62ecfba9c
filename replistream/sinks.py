"""Sinks the application replicas write themselves: :class:`ParquetSink`.

Given per application in ``deploy(..., sinks={app: ParquetSink(folder)})``, every replica of the
application writes the folder itself: no result passes through the driver. The output is cut
into files on a fixed grid of event time (``every``, default 10 s): the file of the cell
``[c * every, (c + 1) * every)`` holds the application's tuples with timestamps in it, sorted by
every column, and is committed once the application's punctuation has passed the cell's end
(no tuple of the cell can come any more: Hwang §II-A's punctuation contract). So the file is
the same whichever replica writes it. A commit is atomic: the replica writes the file under a
hidden name and links it to its final name; the first link wins and a second one finds the
file there and leaves it (``os.link`` fails on an existing name), so a reader never sees a
half-written or a mixed file. At the end of the stream each replica links a completion marker,
``_SUCCESS``, that lists every file and row count; a folder without it holds a run that has not
finished (or failed).

A re-run into a used folder either refuses (``mode="error"``, the default: before anything
starts, with one line naming the folder and the fix) or replaces the files of the earlier run
(``mode="replace"``); it never mixes two runs. Files that are not a sink's are never deleted.

>>> import tempfile, numpy as np
>>> from replistream import Query, run_reference
>>> q = Query("sinks"); s = q.source("s", {"v": "f8"}, punctuate_every=10)
>>> _ = s.filter(lambda b: b["v"] > 0).sink("pos")
>>> sink = ParquetSink(tempfile.mkdtemp(), every=100)
>>> data = {"s": [{"ts": np.arange(0, 300, 10), "v": np.linspace(-1, 1, 30)}]}
>>> out = sink.write_result(q.build(), "pos", run_reference(q.build(), data).outputs["pos"])
>>> sorted(out["files"]), out["rows"], sink.complete()
(['part-0000000000001.parquet', 'part-0000000000002.parquet'], 15, True)
>>> len(sink.read())
15
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from .schema import END, TS, seconds

__all__ = ["ParquetSink", "SinkWriter", "MARKER"]

#: The completion marker's name: written at the end of the stream, it lists every file.
MARKER = "_SUCCESS"

_PREFIX, _SUFFIX = "part-", ".parquet"
_MODES = ("error", "replace")


def _cell_name(c: int) -> str:
    """The file name of grid cell ``c`` (signed, zero-padded: names sort by cell for c >= 0)."""
    return f"{_PREFIX}{'-' if c < 0 else ''}{abs(c):013d}{_SUFFIX}"


def _is_ours(name: str) -> bool:
    return (name.startswith(_PREFIX) and name.endswith(_SUFFIX)) or name == MARKER or \
        (name.startswith(".") and name.endswith(".tmp"))


@dataclass
class ParquetSink:
    """An application's output as Parquet files in ``path``, written by its replicas (see the
    module doc): one file per cell of ``every`` microseconds of event time, committed atomically,
    the same whichever replica writes it, and a ``_SUCCESS`` marker at the end of the stream.

    ``mode``: ``"error"`` refuses a folder that holds files (of an earlier run or anything else);
    ``"replace"`` deletes an earlier run's files first (and refuses a folder holding other files).
    ``keep``: also return the tuples to the driver (``run()``'s ``outputs[app]``), as without a
    sink; by default they stay in the files (``outputs[app]`` empty, read them with :meth:`read`).

    >>> ParquetSink("out/alerts", every=seconds(1))
    ParquetSink(path='out/alerts', every=1000000, mode='error', keep=False)
    """

    path: str
    every: int = field(default=seconds(10))
    mode: str = "error"
    keep: bool = False

    def __post_init__(self):
        self.path = os.fspath(self.path)
        if not isinstance(self.every, (int, np.integer)) or self.every <= 0:
            raise ValueError(f"ParquetSink({self.path!r}): every must be a positive number of microseconds of "
                             f"event time (e.g. replistream.seconds(10)), got {self.every!r}")
        self.every = int(self.every)
        if self.mode not in _MODES:
            raise ValueError(f"ParquetSink({self.path!r}): mode must be one of {_MODES}, got {self.mode!r}")

    # -- before the run (in the driver) -----------------------------------------------------------
    def prepare(self) -> None:
        """Make the folder ready for a run: create it; refuse (``mode="error"``) or clean
        (``mode="replace"``) one that holds files. Raises ``FileExistsError`` naming the folder
        and the fix; deletes nothing that is not a sink's file."""
        os.makedirs(self.path, exist_ok=True)
        present = sorted(os.listdir(self.path))
        if not present:
            return
        if self.mode == "error":
            raise FileExistsError(f"ParquetSink: {self.path!r} is not empty ({len(present)} entries, e.g. "
                                  f"{present[0]!r}): pass ParquetSink(..., mode='replace') to replace an earlier "
                                  f"run's files, or choose an empty folder")
        foreign = [n for n in present if not _is_ours(n)]
        if foreign:
            raise FileExistsError(f"ParquetSink: {self.path!r} holds files no sink wrote (e.g. {foreign[0]!r}); "
                                  f"mode='replace' deletes only a sink's files: choose an empty folder")
        for n in present:
            os.unlink(os.path.join(self.path, n))

    # -- after the run ----------------------------------------------------------------------------
    def complete(self) -> bool:
        """Whether the folder holds a finished run (the completion marker is there)."""
        return os.path.exists(os.path.join(self.path, MARKER))

    def manifest(self) -> dict:
        """The completion marker's content: ``{"files": {name: rows}, "rows", "every"}``."""
        with open(os.path.join(self.path, MARKER)) as f:
            return json.load(f)

    def read(self, complete: bool = True):
        """Every committed file's rows as one numpy structured array (cells in order). With
        ``complete`` (the default) raises unless the run finished (no marker: the run failed or
        runs still), naming the folder; ``complete=False`` reads what is committed so far."""
        import pyarrow.parquet as pq

        if complete and not self.complete():
            raise FileNotFoundError(f"ParquetSink: {self.path!r} has no {MARKER} marker: the run that writes it "
                                    f"has not finished (or failed); read(complete=False) reads the files "
                                    f"committed so far")
        names = sorted((n for n in os.listdir(self.path) if n.startswith(_PREFIX) and n.endswith(_SUFFIX)),
                       key=lambda n: int(n[len(_PREFIX):-len(_SUFFIX)]))
        if complete:
            listed = set(self.manifest()["files"])
            names = [n for n in names if n in listed]
        parts = [pq.read_table(os.path.join(self.path, n)) for n in names]
        if not parts:
            return np.zeros(0, dtype=[(TS, "i8")])
        import pyarrow as pa

        t = pa.concat_tables(parts)
        cols = {n: t.column(n).to_numpy() for n in t.column_names}
        out = np.empty(t.num_rows, dtype=[(n, c.dtype) for n, c in cols.items()])
        for n, c in cols.items():
            out[n] = c
        return out

    def write_result(self, query, app: str, tuples: np.ndarray) -> dict:
        """Write a finished run's ``tuples`` of application ``app`` (e.g. a reference run's) as the
        replicas would: the same files, the same marker. Returns the manifest.

        >>> sink.write_result(q, "alerts", run_reference(q, data).outputs["alerts"])["rows"]   # doctest: +SKIP
        42
        """
        self.prepare()
        w = SinkWriter(self, app, "reference")
        w.add(tuples)
        w.punctuate(END)
        return self.manifest()


def _warm_parquet() -> None:
    """Import Parquet's writer and write one row to memory (what the first real write would load)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [0]}), pa.BufferOutputStream())


class SinkWriter:
    """What one application replica runs for its :class:`ParquetSink`: tuples wait in their grid
    cell until the punctuation passes the cell's end, then the cell is committed (sorted, written
    aside, linked to its name: the first link wins). At the end of the stream every cell left is
    committed and the ``_SUCCESS`` marker linked.

    >>> import tempfile
    >>> w = SinkWriter(ParquetSink(tempfile.mkdtemp(), every=10), "app", "app#0")
    >>> w.add(np.array([(3, 1.0), (15, 2.0)], dtype=[("ts", "i8"), ("v", "f8")]))
    >>> w.punctuate(9), w.punctuate(END)
    ([0], [1])
    """

    def __init__(self, sink: ParquetSink, app: str, label: str):
        self.sink, self.app, self.label = sink, app, label
        self.cells: dict[int, list[np.ndarray]] = {}
        self.written: dict[str, int] = {}  # file name -> rows (committed, by this replica or a peer)
        self.won = 0  # files whose link this replica made first
        self.done = False
        # Parquet's writer costs 1.5-5 s of imports on its first use (pyarrow.parquet, then pandas,
        # which pyarrow loads for a table's metadata): paid while the deployment starts, not when the
        # first cell is committed on the data path (measured with py-spy: a third of a 1M-event run)
        threading.Thread(target=_warm_parquet, daemon=True, name="replistream-parquet-warm").start()

    def add(self, batch: np.ndarray) -> None:
        """Tuples delivered to the application: each waits in its cell."""
        if not len(batch):
            return
        cell = np.floor_divide(batch[TS], self.sink.every)
        for c in np.unique(cell).tolist():
            self.cells.setdefault(int(c), []).append(batch[cell == c])

    def punctuate(self, p: int) -> list[int]:
        """The application's punctuation reached ``p``: commit every cell that ends at or before it
        (all of them at ``END``, then the marker). Returns the cells committed."""
        if self.done:
            return []
        ready = sorted(c for c in self.cells if p == END or (c + 1) * self.sink.every - 1 <= p)
        for c in ready:
            self._commit(c, np.concatenate(self.cells.pop(c)))
        if p == END:
            self._finish()
        return ready

    def _link(self, name: str, write) -> bool:
        """Write a file aside with ``write(tmp_path)`` and link it to ``name``: True if this replica
        made the link (the first), False if a peer had (its file stays; they are the same)."""
        final = os.path.join(self.sink.path, name)
        if os.path.exists(final):
            return False
        tmp = os.path.join(self.sink.path, f".{self.label.replace('#', '-')}-{name}.tmp")
        write(tmp)
        try:
            os.link(tmp, final)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def _commit(self, c: int, rows: np.ndarray) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        names = rows.dtype.names
        order = np.lexsort([rows[n] for n in reversed(names)])  # by every column: the same file from every replica
        rows = rows[order]
        table = pa.table({n: rows[n] for n in names})
        name = _cell_name(c)
        self.won += self._link(name, lambda tmp: pq.write_table(table, tmp))
        self.written[name] = len(rows)

    def _finish(self) -> None:
        """Link the completion marker: every file of the run (this replica's and its peers', which
        are the same cells) with its rows."""
        files = dict(self.written)
        manifest = {"application": self.app, "every": self.sink.every, "rows": int(sum(files.values())),
                    "files": dict(sorted(files.items()))}

        def write(tmp):
            with open(tmp, "w") as f:
                json.dump(manifest, f, indent=1)

        self._link(MARKER, write)
        self.done = True

    def stats(self) -> dict:
        """``{"path", "files", "rows", "won", "complete"}`` for this replica."""
        return {"path": self.sink.path, "files": len(self.written), "rows": int(sum(self.written.values())),
                "won": self.won, "complete": self.done}

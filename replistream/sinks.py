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

A partitioned application (``parallelism={app: p}``, replicas ``app.P#R``) writes one file per
cell *and partition*: partition ``P``'s replicas commit its share of cell ``c`` as
``part-<c>-p<P>.parquet`` (``P`` zero-padded to four digits, so names sort by cell, then
partition), the same bytes whichever of them writes it, and each links its partition's marker
``_SUCCESS-p<P>`` at the end of its stream. A replica that then finds every partition's marker
links ``_SUCCESS``, merged from them (the same bytes whoever links it). :meth:`ParquetSink.complete`,
:meth:`~ParquetSink.manifest` and :meth:`~ParquetSink.read` need every partition's marker (the
merged one, or all ``p`` of ``_SUCCESS-p<P>``), so a folder is complete only when every partition
has finished. An unpartitioned application's folder keeps the layout above, byte for byte.

A re-run into a used folder either refuses (``mode="error"``, the default: before anything
starts, with one line naming the folder and the fix) or replaces the files of the earlier run
(``mode="replace"``); it never mixes two runs. ``replace`` deletes only what is provably the
earlier run's: the files its marker lists, and, when the folder holds this sink's run record
(``_REPLISTREAM_RUN``, written as a run starts, with the run's id), the files of its exact name
pattern (``part-<13 digits>.parquet``, ``part-<13 digits>-p<P>.parquet``, the partitions' markers
and the replicas' hidden ``.tmp`` files). A folder holding
anything else (a pyarrow or Spark dataset, a Spark ``_SUCCESS``, notes) is refused in one line.

Every commit is durable before it is visible: the file is fsynced before it is linked to its name
and the folder is fsynced after. :meth:`ParquetSink.read` checks every file the marker lists
against the row count the marker gives, and raises naming the file that differs or is missing.

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
>>> print(sink.show(n=2))
 ts (s)        v
0.00015  0.03448
0.00016   0.1034
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from .schema import END, TS, seconds

__all__ = ["ParquetSink", "SinkWriter", "MARKER"]

#: The completion marker's name: written at the end of the stream, it lists every file.
MARKER = "_SUCCESS"

#: The run record, written as a run starts: ``{"run": id, "every": ...}`` (Spark and pyarrow skip ``_`` names).
RUN_RECORD = "_REPLISTREAM_RUN"

_PREFIX, _SUFFIX = "part-", ".parquet"
_MODES = ("error", "replace")
#: a cell's file: ``part-<cell>.parquet``, or ``part-<cell>-p<P>.parquet`` for partition ``P``'s share
_FILE = re.compile(r"part-(-?\d{13})(?:-p(\d{4,7}))?\.parquet")
#: a partition's completion marker (a partitioned application): ``_SUCCESS-p<P>``
_PART_MARKER = re.compile(r"_SUCCESS-p(\d{4,7})")
_TMP = re.compile(r"\.[A-Za-z0-9_.@-]+-(part--?\d{13}(?:-p\d{4,7})?\.parquet|_SUCCESS(?:-p\d{4,7})?)\.tmp")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cell_name(c: int, partition: int | None = None) -> str:
    """The file name of grid cell ``c`` (signed, zero-padded: names sort by cell for c >= 0), and
    for partition ``partition`` of a partitioned application its share of the cell.

    >>> _cell_name(3), _cell_name(3, 1)
    ('part-0000000000003.parquet', 'part-0000000000003-p0001.parquet')
    """
    tail = "" if partition is None else f"-p{int(partition):04d}"
    return f"{_PREFIX}{'-' if c < 0 else ''}{abs(c):013d}{tail}{_SUFFIX}"


def _part_marker(partition: int) -> str:
    """The completion marker of partition ``partition``'s replicas: ``_SUCCESS-p0001``."""
    return f"{MARKER}-p{int(partition):04d}"


def _file_key(name: str) -> tuple[int, int]:
    """``(cell, partition)`` of a file name (partition -1 for an unpartitioned run's): the order files are read in."""
    m = _FILE.fullmatch(name)
    return int(m.group(1)), -1 if m.group(2) is None else int(m.group(2))


@dataclass
class ParquetSink:
    """An application's output as Parquet files in ``path``, written by its replicas (see the
    module doc): one file per cell of ``every`` microseconds of event time, committed atomically,
    the same whichever replica writes it, and a ``_SUCCESS`` marker at the end of the stream.

    ``mode``: ``"error"`` refuses a folder that holds files (of an earlier run or anything else);
    ``"replace"`` deletes an earlier run's files first: only those its marker lists or, with its run
    record, of its name pattern; a folder holding anything else is refused.
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
        (``mode="replace"``) one that holds files; then write the run record (a new run id).
        Raises ``FileExistsError`` naming the folder and the fix; deletes nothing that is not
        provably an earlier run's file (see the module doc)."""
        os.makedirs(self.path, exist_ok=True)
        present = sorted(os.listdir(self.path))
        mine = getattr(self, "run_id", None)
        if present == [RUN_RECORD] and mine is not None and (self._record() or {}).get("run") == mine:
            return  # prepared already, by this very sink (a detached deploy() prepares it, then its host does)
        if present and self.mode == "error":
            raise FileExistsError(f"ParquetSink: {self.path!r} is not empty ({len(present)} entries, e.g. "
                                  f"{present[0]!r}): pass ParquetSink(..., mode='replace') to replace an earlier "
                                  f"run's files, or choose an empty folder")
        if present:
            ours = set()
            listed = self._our_manifest()
            if listed is not None:
                ours |= set(listed["files"]) | {MARKER}
                if listed.get("partitions"):  # a partitioned run's markers, one per partition
                    ours |= {_part_marker(i) for i in range(int(listed["partitions"]))}
            if self._record() is not None:
                ours |= {n for n in present if _FILE.fullmatch(n) or _TMP.fullmatch(n) or _PART_MARKER.fullmatch(n)}
                ours |= {RUN_RECORD}
            foreign = [n for n in present if n not in ours]
            if foreign:
                raise FileExistsError(f"ParquetSink: {os.path.abspath(self.path)!r} holds {len(foreign)} file(s) "
                                      f"no run of a ParquetSink wrote (e.g. {foreign[0]!r}); mode='replace' deletes "
                                      f"only an earlier run's files: move them away or choose an empty folder")
            for n in present:
                os.unlink(os.path.join(self.path, n))
        self.run_id = uuid.uuid4().hex
        with open(os.path.join(self.path, RUN_RECORD), "w") as f:
            json.dump({"run": self.run_id, "every": self.every}, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self.path)

    def _record(self) -> dict | None:
        """The run record in the folder (``{"run", "every"}``), or None."""
        try:
            with open(os.path.join(self.path, RUN_RECORD)) as f:
                rec = json.load(f)
            return rec if isinstance(rec, dict) and "run" in rec else None
        except (OSError, ValueError):
            return None

    def _our_manifest(self) -> dict | None:
        """The marker's manifest if the marker is one a ParquetSink wrote (a Spark ``_SUCCESS`` is empty)."""
        try:
            with open(os.path.join(self.path, MARKER)) as f:
                m = json.load(f)
        except (OSError, ValueError):
            return None
        ok = isinstance(m, dict) and isinstance(m.get("files"), dict) and "every" in m
        return m if ok and all(isinstance(n, str) and _FILE.fullmatch(n) for n in m["files"]) else None

    def _partition_markers(self) -> dict | None:
        """A partitioned run's markers (``{partition: manifest}``) when every partition's is there, else None."""
        try:
            names = [n for n in os.listdir(self.path) if _PART_MARKER.fullmatch(n)]
        except OSError:
            return None
        found = {}
        for n in names:
            try:
                with open(os.path.join(self.path, n)) as f:
                    found[int(_PART_MARKER.fullmatch(n).group(1))] = json.load(f)
            except (OSError, ValueError):
                return None
        if not found:
            return None
        p = int(next(iter(found.values())).get("partitions", 0))
        return found if p >= 1 and sorted(found) == list(range(p)) else None

    # -- after the run ----------------------------------------------------------------------------
    def remove_temp_files(self, labels) -> list[str]:
        """Remove the hidden files that the replicas ``labels`` (e.g. ``"pos.1#0"``) left half
        written in the folder: a replica lost while it wrote a file never links or removes it. Call
        it only for replicas that no longer run. :meth:`read` ignores such files either way. Returns
        the names removed.

        >>> import tempfile
        >>> sink = ParquetSink(tempfile.mkdtemp())
        >>> open(os.path.join(sink.path, ".out-0-part-0000000000000.parquet.tmp"), "w").close()
        >>> sink.remove_temp_files(["out#0"]), sink.remove_temp_files(["out#0"])
        (['.out-0-part-0000000000000.parquet.tmp'], [])
        """
        prefixes = tuple(f".{label.replace('#', '-')}-" for label in labels)
        gone = []
        if not prefixes or not os.path.isdir(self.path):
            return gone
        for name in sorted(os.listdir(self.path)):
            if name.startswith(prefixes) and _TMP.fullmatch(name):
                try:
                    os.unlink(os.path.join(self.path, name))
                    gone.append(name)
                except FileNotFoundError:
                    pass  # (removed meanwhile: nothing left to remove)
        return gone

    def complete(self) -> bool:
        """Whether the folder holds a finished run: the completion marker is there (for a
        partitioned application: every partition's marker, ``_SUCCESS-p<P>``, which the replica
        that finds them all merges into ``_SUCCESS``)."""
        return os.path.exists(os.path.join(self.path, MARKER)) or self._partition_markers() is not None

    def manifest(self) -> dict:
        """The completion marker's content: ``{"files": {name: rows}, "rows", "every"}`` (and for
        a partitioned application ``"partitions"``: every partition's files)."""
        try:
            with open(os.path.join(self.path, MARKER)) as f:
                return json.load(f)
        except FileNotFoundError:
            parts = self._partition_markers()
            if parts is None:
                raise
            return _merged(parts)

    def read(self, complete: bool = True):
        """Every committed file's rows as one numpy structured array (cells in order). With
        ``complete`` (the default) raises unless the run finished (no marker: the run failed or
        runs still), naming the folder; ``complete=False`` reads what is committed so far."""
        import pyarrow.parquet as pq

        if complete and not self.complete():
            raise FileNotFoundError(f"ParquetSink: {self.path!r} has no {MARKER} marker: the run that writes it "
                                    f"has not finished (or failed); read(complete=False) reads the files "
                                    f"committed so far")
        names = sorted((n for n in os.listdir(self.path) if _FILE.fullmatch(n)), key=_file_key)
        if complete:
            listed = self.manifest()["files"]
            missing = sorted(set(listed) - set(names))
            if missing:
                raise ValueError(f"ParquetSink: {os.path.join(os.path.abspath(self.path), missing[0])} is listed by "
                                 f"the {MARKER} marker ({listed[missing[0]]} rows) but missing "
                                 f"({len(missing)} file(s) missing): the output is incomplete")
            names = [n for n in names if n in listed]
        parts = [pq.read_table(os.path.join(self.path, n)) for n in names]
        if complete:
            for n, t in zip(names, parts):
                if t.num_rows != int(listed[n]):
                    raise ValueError(f"ParquetSink: {os.path.join(os.path.abspath(self.path), n)} holds "
                                     f"{t.num_rows} rows but the {MARKER} marker lists {listed[n]}: the file was "
                                     f"changed or damaged after the run")
        if not parts:
            return np.zeros(0, dtype=[(TS, "i8")])
        import pyarrow as pa

        t = pa.concat_tables(parts)
        cols = {n: t.column(n).to_numpy() for n in t.column_names}
        out = np.empty(t.num_rows, dtype=[(n, c.dtype) for n, c in cols.items()])
        for n, c in cols.items():
            out[n] = c
        return out

    def show(self, n: int = 10, columns: list[str] | None = None, complete: bool = True) -> str:
        """The first ``n`` tuples in the files (by timestamp, ties by id), as a readable table with
        named columns and times in seconds, as :meth:`RunResult.show <replistream.engines.result.RunResult.show>`
        prints them.

        >>> print(sink.show(n=2))   # doctest: +SKIP
         ts (s)        v
        0.00015  0.03448
        0.00016   0.1034
        """
        from .engines.result import format_rows

        out = self.read(complete)
        order = np.lexsort((out["id"], out[TS])) if "id" in (out.dtype.names or ()) else \
            np.argsort(out[TS], kind="stable")
        return format_rows(out[order][:n], columns)

    def to_pandas(self, complete: bool = True):
        """The tuples in the files as a pandas DataFrame (cells in order), as
        :meth:`RunResult.to_pandas <replistream.engines.result.RunResult.to_pandas>` gives them:
        ``ts`` in microseconds and a datetime column ``time``.

        >>> sink.to_pandas()[["time", "v"]].head(1).to_dict("records")   # doctest: +SKIP
        [{'time': Timestamp('1970-01-01 00:00:00.000150'), 'v': 0.0344...}]
        """
        import pandas as pd

        out = self.read(complete)
        df = pd.DataFrame({name: out[name] for name in out.dtype.names})
        df.insert(1, "time", pd.to_datetime(out[TS], unit="us"))
        return df

    def _warm_up(self, label: str) -> None:
        """Load Parquet's writer in replica ``label``'s process before its first commit (run on a
        thread of its own by :class:`SinkWriter`); a test's subclass may slow one replica's down."""
        _warm_parquet()

    def __len__(self) -> int:
        """Rows of the finished run (the marker's count; the files are checked by :meth:`read`)."""
        return int(self.manifest()["rows"])

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


def canonical_order(rows: np.ndarray) -> np.ndarray:
    """The order that sorts ``rows`` by every field, first field first (so every replica writes a
    cell's rows in the same order, whatever order they arrived in): by ``(ts, id)`` alone when no
    two rows share both (the common case: ids tell tuples apart), by every field when some do.
    Both sorts run on keys nearly in order already (batches arrive nearly in time order), which
    numpy's stable sort merges fast. Sorting by every field took 1.5 s per million rows of seven
    fields here; this takes 25 ms per 450,000 rows in time order, 57 ms shuffled (issue #42: it was
    a third of an application's CPU in a band join's run).

    >>> rows = np.array([(2, 7, 0.5), (1, 9, 0.1), (2, 7, 0.2)], dtype=[("ts", "i8"), ("id", "u8"), ("v", "f8")])
    >>> rows[canonical_order(rows)]["v"].tolist()     # the tie on (ts, id) broken by v
    [0.1, 0.2, 0.5]
    """
    names = rows.dtype.names
    if len(names) >= 2 and names[:2] == (TS, "id") and rows.dtype["id"] == np.uint64 and len(rows) > 1:
        by_ts = np.argsort(rows[TS], kind="stable")  # a merge of sorted runs: batches come nearly in order
        ts, ids = rows[TS][by_ts], rows["id"][by_ts]
        group = np.concatenate((np.zeros(1, np.uint64), np.cumsum(ts[1:] != ts[:-1], dtype=np.uint64)))
        # one 64-bit key: the rank of the timestamp, then the id's top 32 bits, again nearly in order
        key = (group << np.uint64(32)) | (ids >> np.uint64(32))
        within = np.argsort(key, kind="stable")
        key = key[within]
        if np.any(key[1:] == key[:-1]):  # ties on those bits: by the whole id
            within = np.lexsort((ids, group))
        order = by_ts[within]
        ts, ids = ts[within], ids[within]
        if not np.any((ts[1:] == ts[:-1]) & (ids[1:] == ids[:-1])):
            return order
    return np.lexsort([rows[n] for n in reversed(names)])


def dictionary_columns(table, sample: int = 1024) -> list[str]:
    """The columns of ``table`` worth Parquet's dictionary encoding: those with at most half as
    many distinct values as rows among the first ``sample`` rows (keys, labels). Trying a
    dictionary on unique timestamps, ids or measurements costs more than the write itself
    (1M rows of seven such columns: 0.61 s with, 0.14 s without) and saves nothing. A function
    of the rows alone, so every replica writes the same bytes.

    >>> import pyarrow as pa
    >>> dictionary_columns(pa.table({"ts": list(range(100)), "key": [i % 3 for i in range(100)]}))
    ['key']
    """
    head = table.slice(0, sample)
    return [name for name, col in zip(table.column_names, head.columns)
            if len(head) and len(col.unique()) * 2 <= len(head)]


#: The longest a commit waits for its writer's warm-up (:meth:`SinkWriter.wait_warm`, seconds); then
#: it goes on and loads Parquet's writer itself.
WARM_WAIT_S = 60.0


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

    def __init__(self, sink: ParquetSink, app: str, label: str, partition: int | None = None,
                 partitions: int | None = None):
        self.sink, self.app, self.label = sink, app, label
        #: with a partitioned application: this replica's partition, and how many there are (its
        #: files are ``part-<cell>-p<P>.parquet``, its marker ``_SUCCESS-p<P>``)
        self.partition = None if partition is None else int(partition)
        self.partitions = None if partition is None else int(partitions)
        if self.partition is not None and not 0 <= self.partition < self.partitions:
            raise ValueError(f"SinkWriter({label!r}): partition {partition} of {partitions}")
        self.cells: dict[int, list[np.ndarray]] = {}
        self.written: dict[str, int] = {}  # file name -> rows (committed, by this replica or a peer)
        self.won = 0  # files whose link this replica made first
        self.done = False
        # Parquet's writer costs 1.5-5 s of imports on its first use (pyarrow.parquet, then pandas,
        # which pyarrow loads for a table's metadata): paid while the deployment starts, not when the
        # first cell is committed on the data path (measured with py-spy: a third of a 1M-event run).
        # On loaded cores it took up to 9 s: a commit before then waits for it (wait_warm), and the
        # Ray application replica does not count that wait as its data path's silence.
        self.warm = threading.Event()  # set once the warm-up has ended (loaded, or failed: the commit says why)
        self.warm_wait_s = 0.0  # how long commits waited for the warm-up
        threading.Thread(target=self._warm_up, daemon=True, name="replistream-parquet-warm").start()

    def _warm_up(self) -> None:
        try:
            self.sink._warm_up(self.label)
        finally:
            self.warm.set()

    def due(self, p: int) -> bool:
        """Whether :meth:`punctuate` ``(p)`` would commit something (a cell it closes, or the end).

        >>> import tempfile
        >>> w = SinkWriter(ParquetSink(tempfile.mkdtemp(), every=10), "app", "app#0")
        >>> w.add(np.array([(3, 1.0)], dtype=[("ts", "i8"), ("v", "f8")]))
        >>> w.due(5), w.due(9), w.due(END)
        (False, True, True)
        """
        return not self.done and (p == END or any((c + 1) * self.sink.every - 1 <= p for c in self.cells))

    def wait_warm(self, timeout: float = WARM_WAIT_S) -> float:
        """Wait until Parquet's writer is loaded (at most ``timeout`` s; then a commit loads it
        itself). Returns the seconds waited (also added to ``warm_wait_s``)."""
        if self.warm.is_set():
            return 0.0
        t = time.monotonic()
        self.warm.wait(timeout)
        waited = time.monotonic() - t
        self.warm_wait_s += waited
        return waited

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
        if ready or p == END:
            self.wait_warm()
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
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the file's bytes are on disk before its name is
        finally:
            os.close(fd)
        try:
            os.link(tmp, final)
            made = True
        except FileExistsError:
            made = False
        finally:
            os.unlink(tmp)
        _fsync_dir(self.sink.path)  # and the name (and the removal of the hidden one)
        return made

    def _commit(self, c: int, rows: np.ndarray) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        order = canonical_order(rows)  # by every column: the same file from every replica
        table = pa.table({n: rows[n][order] for n in rows.dtype.names})  # column by column, each contiguous
        name = _cell_name(c, self.partition)
        dictionary = dictionary_columns(table)
        self.won += self._link(name, lambda tmp: pq.write_table(table, tmp, use_dictionary=dictionary))
        self.written[name] = len(rows)

    def _finish(self) -> None:
        """Link the completion marker: every file of the run (this replica's and its peers', which
        are the same cells) with its rows. A partition's replica links its partition's marker,
        then, if every partition's is there, the merged ``_SUCCESS`` (the same bytes from whoever
        links it: the first link wins)."""
        files = dict(self.written)
        manifest = {"application": self.app, "every": self.sink.every, "rows": int(sum(files.values())),
                    "files": dict(sorted(files.items()))}
        if self.partition is not None:
            manifest.update({"partition": self.partition, "partitions": self.partitions})
        self._link(MARKER if self.partition is None else _part_marker(self.partition), _json_writer(manifest))
        if self.partition is not None:
            parts = self.sink._partition_markers()
            if parts is not None:  # the last partition to finish (or a peer of it) merges them
                self._link(MARKER, _json_writer(_merged(parts)))
        self.done = True

    def stats(self) -> dict:
        """``{"path", "files", "rows", "won", "complete", "warm_wait_s"}`` for this replica (``"partition"`` too, of a partitioned application)."""
        out = {"path": self.sink.path, "files": len(self.written), "rows": int(sum(self.written.values())),
               "won": self.won, "complete": self.done, "warm_wait_s": round(self.warm_wait_s, 3)}
        if self.partition is not None:
            out["partition"] = self.partition
        return out


def _json_writer(content: dict):
    """A ``write(tmp)`` for :meth:`SinkWriter._link` that writes ``content`` as JSON."""
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(content, f, indent=1)
    return write


def _merged(parts: dict) -> dict:
    """One manifest of a partitioned run from every partition's (``{partition: manifest}``):
    every file with its rows, the rows, ``partitions``; a function of the markers alone, so every
    replica that merges them writes the same ``_SUCCESS``.

    >>> m = _merged({0: {"application": "a", "every": 10, "rows": 2, "files": {"part-0000000000000-p0000.parquet": 2}},
    ...              1: {"application": "a", "every": 10, "rows": 1, "files": {"part-0000000000000-p0001.parquet": 1}}})
    >>> m["rows"], m["partitions"], list(m["files"])
    (3, 2, ['part-0000000000000-p0000.parquet', 'part-0000000000000-p0001.parquet'])
    """
    files = {n: int(r) for m in parts.values() for n, r in m["files"].items()}
    first = parts[min(parts)]
    return {"application": first["application"], "every": first["every"], "rows": int(sum(files.values())),
            "files": dict(sorted(files.items(), key=lambda kv: _file_key(kv[0]))), "partitions": len(parts)}

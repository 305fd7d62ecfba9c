"""Files as sources: Parquet, CSV and Arrow (Feather) files, one file, a directory or a list,
read with ``pyarrow.dataset``; optionally a directory watched for new files.

In a deployment the driver only lists files and hands out work: each file is read and
converted by a Ray task (:func:`_read_file_task`) into chunks in Ray's object store, and the
entry-point replicas take those chunks by reference (:class:`~replistream.sources.ChunkRef`),
so no row passes through the driver. Every entry replica gets the same chunks, so each
derives the same ids (``mix(hash(source), position)``, docs/design.md, decision 1). Run
anywhere else (the reference engine, the in-process engine, a plain ``for`` loop) the same
source reads the files in the calling process, in the same order, with the same conversion:
a reference run over the same files gives the ideal output.

Order: files in the order of their paths (a directory: its files sorted by path, hidden
files and names starting with ``_`` or ``.`` skipped, as Spark and Hadoop write them); rows
in file order. Rows are not sorted: declare ``max_disorder`` on the source if the files
are not in event-time order; later rows are counted and dead-lettered by the entry points.
A row that cannot be carried (a null, an integer out of range, a string longer than its
declared width, a non-finite event time) is dead-lettered with its reason, or raises with
``on_bad_rows="raise"``. A file that cannot be read at all ends the run with an error that
names the file. A reading whose process is lost, crashes or gives no chunk for
:data:`~replistream.reading.READ_TIMEOUT_S` (stopped) is ended and the file read again by a new
task, passing over the chunks already fed (:func:`~replistream.reading.read_chunks`); a file no
reading gets through ends the feed, naming it.

Watching (``watch=True``): after the files present at the start, the directory is polled
every ``poll`` seconds and each new file (complete: writers should write under a hidden or
``_`` name and rename, as Spark does) is read in the order it was found (several found at
once: by path). The source ends when a file named ``end_marker`` appears or after
``idle_timeout`` seconds without a new file; one of the two is required.
:attr:`FileSource.files_read` lists the files read, in order, and :meth:`FileSource.replay`
gives a source over exactly those (what a reference run of a watched run reads).

>>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
>>> d = tempfile.mkdtemp()
>>> pq.write_table(pa.table({"t": [1, 2, 3], "cpu": [0.5, 0.7, 0.9]}), os.path.join(d, "part-0.parquet"))
>>> src = FileSource(d, time="t")
>>> src.schema()
Schema({cpu: <f8})
>>> from replistream import Query, run_reference
>>> q = Query("files"); s = src.declare(q, "load", punctuate_every=10)
>>> _ = s.filter(lambda b: b["cpu"] > 0.6).sink("hot")
>>> run_reference(q.build(), {"load": src}).outputs["hot"]["cpu"].tolist()
[0.7, 0.9]
"""
from __future__ import annotations

import errno
import functools
import os
import time
from collections import deque
from typing import Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from .errors import SchemaError
from .schema import RESERVED, Schema
from .spark.convert import TIME_UNITS, ConversionPlan, convert_table

__all__ = ["FileSource"]

#: file formats and the extensions taken for each when a directory is listed
FORMATS = {"parquet": (".parquet", ".parq", ".pq"), "csv": (".csv", ".csv.gz", ".csv.bz2"),
           "feather": (".feather", ".arrow", ".ipc")}


def _format_of(path: str) -> str | None:
    low = path.lower()
    for fmt, exts in FORMATS.items():
        if low.endswith(exts):
            return fmt
    return None


def _arrow_format(fmt: str):
    return {"parquet": "parquet", "csv": "csv", "feather": "ipc"}[fmt]


def read_schema(path: str, fmt: str) -> pa.Schema:
    """The Arrow schema of one file, as :func:`read_file` will read it (a CSV file's types inferred
    from its first block, as a dataset does), without importing ``pyarrow.dataset`` (which loads
    pandas: 0.2 s of a script's start, issue #42).

    >>> import pyarrow as pa, pyarrow.csv as pacsv, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "a.csv"); pacsv.write_csv(pa.table({"t": [5], "x": [1.5]}), p)
    >>> read_schema(p, "csv")
    t: int64
    x: double
    """
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_schema(path)
    if fmt == "csv":
        import pyarrow.csv as pacsv

        with pacsv.open_csv(path) as reader:
            return reader.schema
    import pyarrow.ipc as ipc

    with pa.memory_map(path) as f:
        return ipc.open_file(f).schema


def _dtype_of(t: pa.DataType, string_width: int) -> str | None:
    """The numpy dtype a column of Arrow type ``t`` becomes by default (None: not carried)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_boolean(t):
        return "?"
    if pa.types.is_integer(t):
        return np.dtype(t.to_pandas_dtype()).str[1:]
    if pa.types.is_floating(t):
        return "f4" if t.bit_width <= 32 else "f8"
    if pa.types.is_timestamp(t):
        return "i8"
    if pa.types.is_date(t):
        return "i4"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return f"U{string_width}"
    return None


def _compatible(t: pa.DataType, dtype: np.dtype) -> bool:
    """Can an Arrow column of type ``t`` fill a field of numpy ``dtype`` (row checks aside)?"""
    if pa.types.is_dictionary(t):
        t = t.value_type
    k = dtype.kind
    if k in "iu":
        return (pa.types.is_integer(t) or pa.types.is_timestamp(t)
                or (pa.types.is_date(t) and dtype.itemsize >= 4))
    if k == "f":
        return pa.types.is_integer(t) or pa.types.is_floating(t)
    if k == "b":
        return pa.types.is_boolean(t)
    if k in "US":
        return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
    if k == "O":
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    return False


def _time_kind(t: pa.DataType) -> str | None:
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    return None


def read_file(path: str, fmt: str, plan: ConversionPlan, chunk_size: int) -> Iterator[tuple[dict, object]]:
    """``(meta, SourceBatch)`` chunks of one file, rows in file order (see
    :func:`~replistream.spark.convert.convert_table`); an unreadable file raises
    :class:`~replistream.errors.SchemaError` naming it.

    >>> import pyarrow as pa, pyarrow.csv as pacsv, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "a.csv"); pacsv.write_csv(pa.table({"t": [5, 6], "x": [1, 2]}), p)
    >>> plan = ConversionPlan("s", "t", "int", 1, Schema({"x": "i8"}), (("x", "x"),))
    >>> [(m["n"], m["tmin"], m["tmax"]) for m, _ in read_file(p, "csv", plan, 10)]
    [(2, 5, 6)]
    """
    columns = [plan.time_col] + [c for _, c in plan.fields]
    try:
        import pyarrow.dataset as pads  # here, not at import: it loads pandas (0.2 s of a script's start)

        dataset = pads.dataset(path, format=_arrow_format(fmt))
        fragments = list(dataset.get_fragments())
        batches = (b for frag in fragments
                   for b in frag.to_batches(columns=columns, batch_size=chunk_size, use_threads=False))
        for batch in batches:
            if batch.num_rows:
                yield from convert_table(pa.Table.from_batches([batch]), plan, chunk_size)
    except SchemaError:
        raise
    except (OSError, pa.ArrowException, ValueError) as e:
        raise SchemaError(f"source {plan.source!r}: cannot read {fmt} file {path}: {type(e).__name__}: {e}") from e


def _read_file_task():
    """The Ray task reading one file into the object store (defined lazily: importing needs no Ray)."""
    import ray

    @ray.remote(num_cpus=0, max_retries=0)
    def read_file_remote(path: str, fmt: str, plan: ConversionPlan, chunk_size: int):
        from .reading import rows_then_meta

        yield from rows_then_meta(read_file(path, fmt, plan, chunk_size))

    return read_file_remote


_TASK = None
_WARMED: set = set()
_READER = None  # an actor reading this process's files instead of tasks (use_reader)


def use_reader(handle) -> None:
    """Read the files of every :class:`FileSource` fed from this process through ``handle``, an
    actor whose ``read`` is :func:`read_file` as a streaming generator (``deploy()`` gives one the
    running cluster's pool kept warm, engines/ray/reader.py), instead of Ray tasks; ``None``: tasks
    again. A reader lost while it reads is replaced by a task that goes on from the next chunk.

    >>> use_reader(None)
    """
    global _READER
    _READER = handle


def _drop_reader(actor) -> None:
    """A reading by ``actor`` was given up on (it died or stopped answering): if it is the reader
    :func:`use_reader` gave, files are read by tasks from now on."""
    if actor is _READER:
        use_reader(None)


def reader():
    """The actor :func:`use_reader` gave, or None (files are read by Ray tasks).

    >>> use_reader(None); reader() is None
    True
    """
    return _READER


def warm_reader() -> None:
    """Start, without waiting, a Ray worker process for this job's file reads, with Parquet's and
    CSV's readers imported, so the first :class:`FileSource` read of a run does not pay for a new
    worker process (issue #42: 1.5 s of a two-source run's 3 s went to waiting for the first
    chunk). Called by ``deploy()`` while the replicas start, for a query with a source declared
    by :meth:`FileSource.declare` (another process would only slow the start of a deployment that
    reads no file); once per Ray job.

    >>> warm_reader()   # doctest: +SKIP
    """
    import ray

    job = ray.get_runtime_context().get_job_id()
    if job in _WARMED:
        return
    _WARMED.add(job)
    _warm_reader_task().remote()


@functools.lru_cache(maxsize=1)
def _warm_reader_task():
    import ray

    @ray.remote(num_cpus=0, max_retries=0)
    def warm_reader_remote() -> int:
        import pyarrow.csv  # noqa: F401 (imported for the reads to come)
        import pyarrow.dataset  # noqa: F401
        import pyarrow.parquet  # noqa: F401

        return os.getpid()

    return warm_reader_remote


def _task():
    global _TASK
    if _TASK is None:
        _TASK = _read_file_task()
    return _TASK


class MissingFileError(SchemaError, FileNotFoundError):
    """A path given to :class:`FileSource` that does not exist: a ``FileNotFoundError`` (and a
    :class:`~replistream.errors.SchemaError`, as before) whose message and ``filename`` are the
    absolute path, so a relative path is never ambiguous.

    >>> e = MissingFileError.at("nowhere/readings")
    >>> print(e)   # doctest: +ELLIPSIS
    [Errno 2] FileSource: no such file or directory: '/.../nowhere/readings'
    >>> isinstance(e, FileNotFoundError) and os.path.isabs(e.filename)
    True
    """

    @classmethod
    def at(cls, path: str, what: str | None = None) -> "MissingFileError":
        full = os.path.abspath(path)
        text = f"FileSource: no such file or directory{f' ({what})' if what else ''}"
        e = cls(f"{text}: {full}")
        e.errno, e.strerror, e.filename = errno.ENOENT, text, full
        return e


class FileSource:
    """Parquet, CSV or Feather files as a source (see the module doc).

    ``path``: a file, a directory, or a list of files. ``format``: ``"parquet"``,
    ``"csv"`` or ``"feather"`` (default: from the extensions). ``time`` names the
    event-time column (timestamp, date, or a number in ``time_unit``: ``"us"``,
    ``"ms"``, ``"s"``, ``"min"``, ``"h"``); ``columns`` the payload (a list, or
    ``{field: column}`` to rename; default every other column). ``chunk_size`` rows
    per chunk; ``prefetch`` files read ahead of the feeder in a deployment. In a deployment a
    file's reading that gives no chunk for ``read_timeout_s`` seconds (its process stopped, or
    storage that slow) is ended and read again by a new process
    (None: :data:`~replistream.reading.READ_TIMEOUT_S`; raise it for storage that can take longer
    for one chunk).

    >>> src = FileSource("readings/", time="event_time", columns={"cpu": "cpu_load"})   # doctest: +SKIP
    >>> load = src.declare(q, "load", punctuate_every=seconds(1), max_disorder=seconds(2))   # doctest: +SKIP
    >>> dep.run({"load": src})                                                           # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike], time: str = "ts",
                 columns: Sequence[str] | Mapping[str, str] | None = None, *, format: str | None = None,
                 time_unit: str = "us", chunk_size: int = 10_000, string_width: int = 64,
                 on_bad_rows: str = "dead_letter", prefetch: int = 2, watch: bool = False, poll: float = 0.5,
                 idle_timeout: float | None = None, end_marker: str | None = None,
                 read_timeout_s: float | None = None):
        if on_bad_rows not in ("dead_letter", "raise"):
            raise ValueError(f"on_bad_rows must be 'dead_letter' or 'raise', got {on_bad_rows!r}")
        if time_unit not in TIME_UNITS:
            raise ValueError(f"time_unit must be one of {sorted(TIME_UNITS)}, got {time_unit!r}")
        for name, v in (("chunk_size", chunk_size), ("string_width", string_width), ("prefetch", prefetch)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
        if format is not None and format not in FORMATS:
            raise ValueError(f"format must be one of {sorted(FORMATS)}, got {format!r}")
        from .reading import positive_seconds

        self.read_timeout_s = positive_seconds("read_timeout_s", read_timeout_s, optional=True)
        self.paths = [os.fspath(p) for p in path] if isinstance(path, (list, tuple)) else [os.fspath(path)]
        if not self.paths:
            raise ValueError("FileSource needs at least one path")
        self.watch = bool(watch)
        if self.watch:
            if len(self.paths) == 1 and not os.path.exists(self.paths[0]):
                raise MissingFileError.at(self.paths[0], "the folder to watch")
            if len(self.paths) != 1 or not os.path.isdir(self.paths[0]):
                raise ValueError(f"watch=True needs one directory, got {self.paths}")
            if idle_timeout is None and end_marker is None:
                raise ValueError("a watched directory needs an end: idle_timeout=<seconds without a new file> "
                                 "or end_marker=<file name that ends the stream>")
            if poll <= 0 or (idle_timeout is not None and idle_timeout <= 0):
                raise ValueError(f"poll and idle_timeout must be > 0, got {poll} and {idle_timeout}")
        self.poll = float(poll)
        self.idle_timeout = idle_timeout
        self.end_marker = end_marker
        self.time = time
        self.time_unit = time_unit
        self.chunk_size = int(chunk_size)
        self.string_width = int(string_width)
        self.on_bad_rows = on_bad_rows
        self.prefetch = int(prefetch)
        initial = self._list()
        if not initial and not self.watch:
            raise SchemaError(f"no {format or 'parquet, csv or feather'} files at {self.paths}")
        self.format = format or self._guess_format(initial)
        self._arrow_schema = self._read_schema(initial) if initial else None
        self._columns = columns
        self._bound: tuple[str, Schema] | None = None
        self._remote = False
        self.files_read: list[str] = []
        self.stats = {"files": 0, "rows": 0, "chunks": 0, "rejected": {}}
        if self._arrow_schema is not None:
            self._resolve_columns()

    # -- files -----------------------------------------------------------------------------
    def _list(self, fmt: str | None = None) -> list[str]:
        """Every data file under the paths, by path (directories listed; hidden and ``_`` names skipped)."""
        fmt = fmt or getattr(self, "format", None)
        out = []
        for p in self.paths:
            if os.path.isdir(p):
                for root, dirs, files in os.walk(p):
                    dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                    for f in files:
                        if f.startswith((".", "_")):
                            continue
                        full = os.path.join(root, f)
                        found = _format_of(full)
                        if found is not None and (fmt is None or found == fmt):
                            out.append(full)
            elif os.path.exists(p):
                out.append(p)
            else:
                raise MissingFileError.at(p)
        return sorted(out) if len(self.paths) == 1 else out

    def _guess_format(self, files: list[str]) -> str:
        kinds = {_format_of(f) for f in files} - {None}
        if len(kinds) == 1:
            return kinds.pop()
        if not kinds and not files:
            raise ValueError("give format='parquet', 'csv' or 'feather' for a directory watched from empty")
        raise SchemaError(f"cannot tell the format of {self.paths} (found {sorted(map(str, kinds)) or 'no known extension'}); "
                          "pass format='parquet', 'csv' or 'feather'")

    def _read_schema(self, files: list[str]) -> pa.Schema:
        try:
            return read_schema(files[0], self.format)
        except (OSError, pa.ArrowException, ValueError) as e:
            raise SchemaError(f"cannot read {self.format} file {files[0]}: {type(e).__name__}: {e}") from e

    def _resolve_columns(self) -> None:
        types = {f.name: f.type for f in self._arrow_schema}
        if self.time not in types:
            raise SchemaError(f"event-time column {self.time!r} is not in the files; their columns are {list(types)}")
        self.time_kind = _time_kind(types[self.time])
        if self.time_kind is None:
            raise SchemaError(f"event-time column {self.time!r} has type {types[self.time]}; it must be a timestamp, "
                              "date or number (for CSV text times, write them as ISO 8601 so they read as timestamps)")
        columns = self._columns
        if columns is None:
            columns = [c for c in types if c != self.time]
        pairs = ([(str(f), str(c)) for f, c in columns.items()] if isinstance(columns, Mapping)
                 else [(str(c), str(c)) for c in columns])
        missing = [c for _, c in pairs if c not in types]
        if missing:
            raise SchemaError(f"column(s) {missing} not in the files; their columns are {list(types)}")
        for f, c in pairs:
            if f in RESERVED:
                raise SchemaError(f"column {c!r} would become field {f!r}, which is reserved (every stream has "
                                  f"'ts' and 'id'); rename it: columns={{'{f}_': '{c}'}}")
            if not f.isidentifier():
                raise SchemaError(f"column {c!r}: field name {f!r} is not an identifier; rename it with "
                                  "columns={field: column}")
        self._types = types
        self.pairs = pairs

    def _need_schema(self) -> None:
        if self._arrow_schema is None:
            raise SchemaError(f"no {self.format} file in {self.paths} yet, so its columns are unknown: declare the "
                              "source's schema yourself (query.source(name, {...})) or start with one file present")

    # -- schema ------------------------------------------------------------------------------
    def schema(self) -> Schema:
        """The source schema the chosen columns give (Arrow type -> numpy dtype; strings get
        ``string_width`` characters)."""
        self._need_schema()
        fields = []
        for f, c in self.pairs:
            dt = _dtype_of(self._types[c], self.string_width)
            if dt is None:
                raise SchemaError(f"column {c!r} has type {self._types[c]}, which replistream cannot carry; "
                                  "leave it out with columns=[...]")
            fields.append((f, dt))
        return Schema(fields)

    def declare(self, query, name: str, punctuate_every: int | None = None, max_disorder: int = 0):
        """Declare source ``name`` in ``query`` with these files' schema; returns the stream. The
        source is marked as read from files, so a deployment of the query starts a worker for the
        reads as it starts (:func:`warm_reader`)."""
        stream = query.source(name, self.schema(), punctuate_every=punctuate_every, max_disorder=max_disorder)
        query.graph.nodes[name]["files"] = True
        return stream

    def bind(self, source: str, schema: Schema) -> None:
        """Check the columns against the schema of ``source``; called by ``Deployment.feed``, after
        which the next iteration hands out chunks read by Ray tasks (:class:`ChunkRef` s)."""
        self._check(source, schema)
        self._remote = True

    def _check(self, source: str, schema: Schema) -> None:
        if self._arrow_schema is None:  # a watched directory, empty so far: the fields are the schema's
            self.pairs = [(f, f) for f in schema.names]
            self.time_kind = None
            self._bound = (source, schema)
            return
        names = [f for f, _ in self.pairs]
        if self._columns is None:  # default columns: those the source declares
            self.pairs = [(f, c) for f, c in self.pairs if f in schema.names]
            names = [f for f, _ in self.pairs]
        lacking = [f for f in schema.names if f not in names]
        if lacking:
            raise SchemaError(f"source {source!r} needs field(s) {lacking} but the files give {names}; "
                              "name them with columns=[...] or columns={field: column}")
        extra = [f for f in names if f not in schema.names]
        if extra:
            raise SchemaError(f"source {source!r} has no field(s) {extra}; its schema is {list(schema.names)}")
        for f, c in self.pairs:
            if not _compatible(self._types[c], schema[f]):
                raise SchemaError(f"source {source!r}: column {c!r} has type {self._types[c]} but field {f!r} is "
                                  f"{schema[f]}")
        self._bound = (source, schema)

    def _plan(self, first_file: str | None = None) -> ConversionPlan:
        if self._arrow_schema is None and first_file is not None:
            self._arrow_schema = self._read_schema([first_file])
            bound = self._bound
            self._resolve_columns()
            if bound is not None:
                self._check(*bound)
        if self._bound is None:
            self._check("<files>", self.schema())
        source, schema = self._bound
        return ConversionPlan(source, self.time, self.time_kind, TIME_UNITS[self.time_unit], schema,
                              tuple(self.pairs), self.on_bad_rows)

    # -- the files, in order -------------------------------------------------------------------
    def _files(self) -> Iterator[str | None]:
        """The files to read, in order. Watching, after the files already there: each new file as
        it is found, and ``None`` when a look found nothing new yet (the caller then serves what
        it has, or waits ``poll`` seconds), until the end marker or the idle timeout."""
        seen: set[str] = set()
        for f in self._list():
            seen.add(f)
            yield f
        if not self.watch:
            return
        last_new = time.monotonic()
        marker = None if self.end_marker is None else os.path.join(self.paths[0], self.end_marker)
        while True:
            ended = marker is not None and os.path.exists(marker)
            new = [f for f in self._list() if f not in seen]
            for f in new:
                seen.add(f)
                yield f
            if new:
                last_new = time.monotonic()
            if ended:
                return
            if self.idle_timeout is not None and time.monotonic() - last_new >= self.idle_timeout:
                return
            yield None

    def replay(self) -> "FileSource":
        """A source over exactly the files this one read, in the same order (the input of a
        reference run for a watched directory).

        >>> src = FileSource("incoming/", time="t", watch=True, idle_timeout=5.0)   # doctest: +SKIP
        >>> res = dep.run({"load": src})                                            # doctest: +SKIP
        >>> ideal = run_reference(q, {"load": src.replay()})                        # doctest: +SKIP
        """
        if not self.files_read:
            raise ValueError("this source has read no file yet")
        return FileSource(list(self.files_read), self.time, self._columns, format=self.format,
                          time_unit=self.time_unit, chunk_size=self.chunk_size, string_width=self.string_width,
                          on_bad_rows=self.on_bad_rows, prefetch=self.prefetch,
                          read_timeout_s=getattr(self, "read_timeout_s", None))

    def _account(self, meta: dict) -> None:
        self.stats["rows"] += meta["n"]
        self.stats["chunks"] += 1
        for r, c in meta["rejected"].items():
            self.stats["rejected"][r] = self.stats["rejected"].get(r, 0) + c

    def __iter__(self) -> Iterator:
        remote, self._remote = self._remote, False
        self.files_read = []
        self.stats = {"files": 0, "rows": 0, "chunks": 0, "rejected": {}}
        return self._remote_chunks() if remote else self._local_chunks()

    def _local_chunks(self) -> Iterator:
        """:class:`~replistream.operators.entry.SourceBatch` chunks read in this process."""
        plan = None
        for f in self._files():
            if f is None:  # watching: nothing new yet
                time.sleep(self.poll)
                continue
            plan = plan or self._plan(f)
            self.files_read.append(f)
            self.stats["files"] += 1
            for meta, sb in read_file(f, self.format, plan, self.chunk_size):
                self._account(meta)
                yield sb

    def _remote_chunks(self) -> Iterator:
        """:class:`~replistream.sources.ChunkRef` s of chunks read by Ray tasks, up to ``prefetch``
        files ahead; watching, a file is served as soon as it is read, not held for the next one."""
        import ray

        from .reading import read_chunks
        from .sources import ChunkRef

        task = _task()
        plan = None
        pending: deque = deque()
        files = self._files()
        ended = False

        def start(f: str):
            """Begin reading ``f``: by the reader actor when there is one (:func:`use_reader`), else a
            task; ``(generator, the reader actor or None)``."""
            reader = _READER
            run = task if reader is None else reader.read
            return run.options(num_returns="streaming").remote(f, self.format, plan, self.chunk_size), reader

        def launch() -> bool:
            """Start reading the next file; False when there is none (yet, or any more)."""
            nonlocal plan, ended
            f = next(files, False)
            if f is False:
                ended = True
                return False
            if f is None:
                return False
            plan = plan or self._plan(f)
            self.files_read.append(f)
            self.stats["files"] += 1
            pending.append((f, *start(f)))
            return True

        while True:
            while not ended and len(pending) < self.prefetch and launch():
                pass
            if not pending:
                if ended:
                    return
                time.sleep(self.poll)  # watching: nothing new yet
                continue
            f, gen, via = pending.popleft()
            try:
                for data_ref, meta in read_chunks((gen, via), lambda: start(f), f, plan.source, _drop_reader,
                                                  timeout=getattr(self, "read_timeout_s", None)):
                    self._account(meta)
                    yield ChunkRef(data_ref, meta["n"], meta["tmin"], meta["tmax"])
            except ray.exceptions.RayTaskError as e:  # the reading raised: the file is the problem
                cause = e.as_instanceof_cause()
                raise (cause if isinstance(cause, SchemaError) else
                       SchemaError(f"source {plan.source!r}: reading {f} failed: {e}")) from None

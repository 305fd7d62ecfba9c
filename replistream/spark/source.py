"""Spark DataFrames as replistream sources.

:class:`SparkSource` replays a DataFrame from any reader (Parquet, CSV, JSON,
a table) into a source's entry points; :class:`SparkStreamSource` feeds them
continuously from a Structured Streaming DataFrame, one micro-batch at a
time. Either way the rows go Spark -> RayDP -> Ray's object store -> a Ray
task that converts them (:mod:`replistream.spark.convert`) -> the entry point
replicas; the driver only sees object references and per-chunk counts.

The user names the event-time column and the payload columns. Their Spark
types are checked before the stream starts (a missing column, a string event
time or a column of the wrong type raises :class:`~replistream.errors.SchemaError`
naming the column); what can only be seen in the data (a null, an integer
out of range, a string longer than its declared width) is dead-lettered by
the entry points with a count per reason.

>>> spark = spark_session()                                         # doctest: +SKIP
>>> df = spark.read.parquet("readings/")                            # doctest: +SKIP
>>> src = SparkSource(df, time="event_time", columns=["server", "cpu"])   # doctest: +SKIP
>>> q = Query("q"); s = src.declare(q, "load", punctuate_every=seconds(1), max_disorder=seconds(2))  # doctest: +SKIP
>>> dep.run({"load": src})                                          # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import queue
import re
import tempfile
import threading
import time
from collections import deque
from typing import Iterator, Mapping, Sequence

import numpy as np

from ..errors import ReplistreamError, SchemaError
from ..schema import RESERVED, TS, Punctuation, Schema
from ..sources import Handed
from .convert import TIME_UNITS, ConversionPlan, convert_table

_INT_BITS = {"ByteType": 8, "ShortType": 16, "IntegerType": 32, "LongType": 64}
_DEFAULT_DTYPE = {"ByteType": "i1", "ShortType": "i2", "IntegerType": "i4", "LongType": "i8",
                  "FloatType": "f4", "DoubleType": "f8", "BooleanType": "?",
                  "TimestampType": "i8", "TimestampNTZType": "i8", "DateType": "i4"}


def _tname(dt) -> str:
    return type(dt).__name__


def _compatible(dt, dtype: np.dtype) -> bool:
    """Can a Spark column of type ``dt`` fill a field of numpy ``dtype`` (row checks aside)?"""
    t = _tname(dt)
    k = dtype.kind
    if k in "iu":
        return t in _INT_BITS or (t in ("TimestampType", "TimestampNTZType", "DateType") and dtype.itemsize >= 4)
    if k == "f":
        return t in _INT_BITS or t in ("FloatType", "DoubleType")
    if k == "b":
        return t == "BooleanType"
    if k in "US":
        return t in ("StringType", "VarcharType", "CharType")
    if k == "O":
        return t in ("StringType", "VarcharType", "CharType")
    return False


def _convert_block_task():
    """The Ray task converting one Arrow block (defined lazily so importing needs no Ray)."""
    import ray

    @ray.remote(num_cpus=0, max_retries=3)
    def convert_block(table, plan: ConversionPlan, chunk_size: int):
        from ..reading import rows_then_meta

        yield from rows_then_meta(convert_table(table, plan, chunk_size))

    return convert_block


_TASK = None


def _task():
    global _TASK
    if _TASK is None:
        _TASK = _convert_block_task()
    return _TASK


class SparkSourceError(ReplistreamError, RuntimeError):
    """A Spark job feeding a source failed, or a partition it computed was lost before it was read."""


def _summary(e: BaseException) -> str:
    """One line for a Spark job's failure: the Python worker's exception line when there is one
    (a Py4JJavaError carries the whole Java stack trace), else the first line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    py = [ln for ln in lines if re.match(r"^[A-Za-z_][A-Za-z0-9_]*(Error|Exception|Warning): ", ln)]
    line = py[-1] if py else (lines[0] if lines else type(e).__name__)
    return line if len(line) <= 300 else line[:297] + "..."


class _PartitionStream:
    """A DataFrame's partitions as Arrow blocks in Ray's object store, each as soon as Spark has it.

    ``DataFrame.toArrowBatchRdd`` (Spark's Arrow batches per partition) is
    persisted and counted by a background Spark job; every partition is
    cached by the executor that computed it the moment its task ends.
    :meth:`blocks` waits for partition 0, 1, ... in turn to have a cached
    block (the block manager's locations, asked through the driver's JVM) and
    starts a Ray task that fetches it from that executor (RayDP's executor
    actors serve cached partitions as Arrow IPC). A failed Spark job raises
    :class:`SparkSourceError` naming the source and the partition waited
    for; :meth:`close` cancels the job if it is still running and drops the
    cache. A job that makes no progress (no task of it finishes, no partition
    is cached) for ``stall_s`` seconds while a partition is waited for (an
    executor stopped: Spark itself waits ``spark.network.timeout``, then for an
    executor that may never come) is cancelled and raises
    :class:`SparkSourceError` naming the partition, instead of a wait without
    end; so is one left with no executor alive for a minute (every executor
    lost: RayDP starts none again), without waiting the whole ``stall_s``.
    """

    _POLL_MIN_S, _POLL_MAX_S = 0.002, 0.05
    _PROGRESS_EVERY_S = 1.0  # how often Spark's status tracker is asked while a partition is waited for
    #: Seconds with no Spark executor alive before the wait ends (at most ``stall_s``): RayDP does not
    #: start an executor again once it is lost (seen: none in 40 s after all were killed), and a
    #: session's first executors register within seconds.
    _NO_EXECUTOR_S = 60.0

    def __init__(self, df, source: str, stall_s: float = 300.0):
        from pyspark import StorageLevel

        self.source = source
        self.sc = df.sparkSession.sparkContext
        jvm = self.sc._jvm
        self._jvm = jvm
        writer = jvm.org.apache.spark.sql.raydp.ObjectStoreWriter
        self.schema_json = writer.toArrowSchema(df._jdf).toJson()
        self.agent_url = writer.driverAgentUrl() or ""
        self.rdd = df._jdf.toArrowBatchRdd()
        self.rdd.persist(self.sc._getJavaStorageLevel(StorageLevel.MEMORY_AND_DISK))
        self.rdd_id = int(self.rdd.id())
        self.n = int(self.rdd.getNumPartitions())
        self.stall_s = float(stall_s)
        self.group = f"replistream-source-{source}-{self.rdd_id}"
        self._done = threading.Event()
        self._error: list[BaseException] = []
        self._closed = False
        threading.Thread(target=self._run, daemon=True, name=f"replistream-spark-{source}").start()

    def _run(self) -> None:
        try:
            self.sc.setJobGroup(self.group, f"replistream source {self.source!r}", interruptOnCancel=True)
            self.rdd.count()
        except BaseException as e:  # raised to the consumer by blocks()
            self._error.append(e)
        finally:
            self._done.set()

    def _location(self, i: int) -> str | None:
        """The executor id holding partition ``i``'s cached block, or None while it has none."""
        master = self._jvm.org.apache.spark.SparkEnv.get().blockManager().master()
        locs = master.getLocations(self._jvm.org.apache.spark.storage.RDDBlockId(self.rdd_id, i))
        return None if locs.isEmpty() else str(locs.head().executorId())

    def _progress(self) -> int:
        """Tasks of this stream's Spark job finished so far (Spark's status tracker)."""
        tracker = self.sc.statusTracker()
        done = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in (job.stageIds if job is not None else ()):
                stage = tracker.getStageInfo(stage_id)
                done += stage.numCompletedTasks if stage is not None else 0
        return done

    def _executors(self) -> int:
        """Spark executors alive now (Spark's status tracker lists the driver too)."""
        return max(0, len(self.sc._jsc.sc().statusTracker().getExecutorInfos()) - 1)

    def _wait(self, i: int) -> str:
        pause = self._POLL_MIN_S
        now = time.monotonic()
        last, seen, asked = now, self._progress(), now  # (Spark's progress: when it last moved, and how far)
        alone = None  # since when no executor is alive
        while True:
            finished = self._done.is_set()
            loc = self._location(i)
            if loc is not None:
                return loc
            if self._error:
                raise SparkSourceError(f"source {self.source!r}: the Spark job computing its partitions failed "
                                       f"before partition {i} of {self.n} was read; nothing of partitions "
                                       f"{i}..{self.n - 1} was fed: {_summary(self._error[0])}") \
                    from self._error[0]
            if finished:
                raise SparkSourceError(f"source {self.source!r}: partition {i} of {self.n} is not cached by any "
                                       "Spark executor after the job ended (an executor was lost?); nothing of "
                                       f"partitions {i}..{self.n - 1} was fed")
            now = time.monotonic()
            if now - asked >= self._PROGRESS_EVERY_S:
                asked, done = now, self._progress()
                alone = None if self._executors() else (alone or now)
                if alone is not None and now - alone > min(self.stall_s, self._NO_EXECUTOR_S):
                    self.sc.cancelJobGroup(self.group)
                    raise SparkSourceError(
                        f"source {self.source!r}: no Spark executor has been alive for {now - alone:.0f} s (every "
                        f"executor was lost, and none was started again): partition {i} of {self.n} cannot be "
                        f"computed; the job was cancelled, and nothing of partitions {i}..{self.n - 1} was fed")
                if done != seen:
                    last, seen = now, done
                elif now - last > self.stall_s:
                    self.sc.cancelJobGroup(self.group)
                    raise SparkSourceError(
                        f"source {self.source!r}: the Spark job computing its partitions made no progress for "
                        f"{now - last:.0f} s (no task finished, partition {i} of {self.n} not cached; a Spark "
                        f"executor stopped or lost?): it was cancelled, and nothing of partitions "
                        f"{i}..{self.n - 1} was fed; SparkSource(stall_timeout_s=...) sets how long to wait")
            self._done.wait(pause)
            pause = min(self._POLL_MAX_S, pause * 2)

    def blocks(self) -> Iterator:
        """Object refs of each partition's Arrow table, in partition order, each once it is cached."""
        from raydp.spark.dataset import _fetch_arrow_table_from_executor

        fetch = _fetch_arrow_table_from_executor.options(num_cpus=0)
        for i in range(self.n):
            executor = self._wait(i)
            yield fetch.remote(f"raydp-executor-{executor}", self.rdd_id, i, self.schema_json, self.agent_url)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._done.is_set():
            self.sc.cancelJobGroup(self.group)
            self._done.wait(30)
        with contextlib.suppress(Exception):  # the session may be gone already
            self.rdd.unpersist(False)


class _SparkInput:
    """What the batch and the streaming source share: column choice, type checks, conversion."""

    def __init__(self, df, time: str, columns: Sequence[str] | Mapping[str, str] | None, time_unit: str,
                 chunk_size: int, string_width: int, on_bad_rows: str, stall_timeout_s: float = 300.0,
                 read_timeout_s: float | None = None):
        from ..reading import positive_seconds

        self.stall_timeout_s = positive_seconds("stall_timeout_s", stall_timeout_s)
        self.read_timeout_s = positive_seconds("read_timeout_s", read_timeout_s, optional=True)
        if on_bad_rows not in ("dead_letter", "raise"):
            raise ValueError(f"on_bad_rows must be 'dead_letter' or 'raise', got {on_bad_rows!r}")
        if time_unit not in TIME_UNITS:
            raise ValueError(f"time_unit must be one of {sorted(TIME_UNITS)}, got {time_unit!r}")
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        if int(string_width) < 1:
            raise ValueError(f"string_width must be >= 1, got {string_width}")
        self.df = df
        self.time = time
        self.time_unit = time_unit
        self.chunk_size = int(chunk_size)
        self.string_width = int(string_width)
        self.on_bad_rows = on_bad_rows
        types = {f.name: f.dataType for f in df.schema.fields}
        self._types = types
        if time not in types:
            raise SchemaError(f"event-time column {time!r} is not in the DataFrame; its columns are "
                              f"{list(types)}")
        tk = _tname(types[time])
        if tk in ("TimestampType", "TimestampNTZType"):
            self.time_kind = "timestamp"
        elif tk == "DateType":
            self.time_kind = "date"
        elif tk in _INT_BITS:
            self.time_kind = "int"
        elif tk in ("FloatType", "DoubleType"):
            self.time_kind = "float"
        else:
            raise SchemaError(f"event-time column {time!r} has Spark type {types[time].simpleString()}; it must "
                              f"be a timestamp, date or numeric column (e.g. F.to_timestamp({time!r}) in Spark)")
        if columns is None:
            columns = [c for c in types if c != time]
        if isinstance(columns, Mapping):
            pairs = [(str(f), str(c)) for f, c in columns.items()]
        else:
            pairs = [(str(c), str(c)) for c in columns]
        missing = [c for _, c in pairs if c not in types]
        if missing:
            raise SchemaError(f"column(s) {missing} not in the DataFrame; its columns are {list(types)}")
        for f, c in pairs:
            if f in RESERVED:
                raise SchemaError(f"column {c!r} would become field {f!r}, which is reserved (every stream has "
                                  f"'ts' and 'id'); rename it: columns={{'{f}_': '{c}'}}")
            if not f.isidentifier():
                raise SchemaError(f"column {c!r}: field name {f!r} is not an identifier; "
                                  "rename it with columns={field: column}")
        self.pairs = pairs
        self._bound: tuple[str, Schema] | None = None
        self.stats = {"rows": 0, "chunks": 0, "rejected": {}}
        self.partitions = 0  # Spark partitions fully handed over so far

    # -- schema ---------------------------------------------------------------------------
    def schema(self) -> Schema:
        """The source schema these columns give (Spark type -> numpy dtype; strings get ``string_width``)."""
        fields = []
        for f, c in self.pairs:
            dt = self._types[c]
            t = _tname(dt)
            if t in ("StringType", "VarcharType", "CharType"):
                fields.append((f, f"U{self.string_width}"))
            elif t in _DEFAULT_DTYPE:
                fields.append((f, _DEFAULT_DTYPE[t]))
            else:
                raise SchemaError(f"column {c!r} has Spark type {dt.simpleString()}, which replistream cannot "
                                  "carry; cast or drop it in Spark")
        return Schema(fields)

    def declare(self, query, name: str, punctuate_every: int | None = None, max_disorder: int = 0):
        """Declare source ``name`` in ``query`` with this DataFrame's schema; returns the stream.

        ``max_disorder`` (microseconds) is the declared bound on disorder:
        rows later than it are counted and dead-lettered by the entry points.
        """
        return query.source(name, self.schema(), punctuate_every=punctuate_every, max_disorder=max_disorder)

    def bind(self, source: str, schema: Schema) -> None:
        """Check the columns against the schema of ``source`` (called by ``Deployment.feed``)."""
        names = [f for f, _ in self.pairs]
        extra = [f for f in names if f not in schema.names]
        lacking = [f for f in schema.names if f not in names]
        if lacking:
            raise SchemaError(f"source {source!r} needs field(s) {lacking} but the Spark source gives {names}; "
                              "name them with columns=[...] or columns={field: column}")
        if extra:
            raise SchemaError(f"source {source!r} has no field(s) {extra}; its schema is {list(schema.names)}")
        for f, c in self.pairs:
            dt = self._types[c]
            if not _compatible(dt, schema[f]):
                raise SchemaError(f"source {source!r}: column {c!r} has Spark type {dt.simpleString()} but field "
                                  f"{f!r} is {schema[f]}; cast it in Spark (F.col({c!r}).cast(...))")
        self._bound = (source, schema)

    def _plan(self) -> ConversionPlan:
        if self._bound is None:
            self.bind("<spark>", self.schema())
        source, schema = self._bound
        return ConversionPlan(source, TS, self.time_kind, TIME_UNITS[self.time_unit], schema,
                              tuple((f, f) for f, _ in self.pairs), self.on_bad_rows)

    def _select(self, df):
        from pyspark.sql import functions as F

        return df.select(F.col(self.time).alias(TS), *[F.col(c).alias(f) for f, c in self.pairs])

    def _account(self, meta: dict) -> None:
        self.stats["rows"] += meta["n"]
        self.stats["chunks"] += 1
        for r, c in meta["rejected"].items():
            self.stats["rejected"][r] = self.stats["rejected"].get(r, 0) + c

    def _chunks_of(self, prepared, plan: ConversionPlan, prefetch: int) -> Iterator:
        """ChunkRefs for a prepared DataFrame, partition by partition, in partition order.

        Spark computes the partitions in a background job that caches each one
        (as Arrow batches, in the executors) as soon as it is done; a partition
        is fetched by a Ray task from its executor and converted by another as
        soon as it is cached, at most ``prefetch`` partitions ahead of the
        feeder. The first chunks thus reach the entry points while Spark is
        still reading later partitions, and the rows never pass through the
        driver, which only sees object references and per-chunk counts.
        """
        from ..reading import read_chunks
        from ..sources import ChunkRef

        stream = _PartitionStream(prepared, plan.source, getattr(self, "stall_timeout_s", 300.0))
        failed: list[SparkSourceError] = []
        pending: deque = deque()
        task = _task()
        blocks = stream.blocks()

        def convert(block):
            """A reading of one partition's block: ``(streaming generator, None)`` (a task)."""
            return task.options(num_returns="streaming").remote(block, plan, self.chunk_size), None

        started = 0  # partitions of this DataFrame whose conversion started

        def advance() -> None:
            """Start converting the next partition (the partitions before a failed one are fed first)."""
            nonlocal started
            if failed:
                return
            try:
                block = next(blocks, None)
            except SparkSourceError as e:
                failed.append(e)
                return
            if block is not None:
                pending.append((started, block, convert(block)))
                started += 1

        try:
            for _ in range(prefetch):
                advance()
            while pending:
                i, block, first = pending.popleft()
                # a conversion whose process dies or stops answering is replaced (replistream.reading)
                for data_ref, meta in read_chunks(first, lambda: convert(block), f"partition {i} of its "
                                                  f"DataFrame", plan.source,
                                                  timeout=getattr(self, "read_timeout_s", None)):
                    self._account(meta)
                    yield ChunkRef(data_ref, meta["n"], meta["tmin"], meta["tmax"])
                self.partitions += 1
                advance()
            if failed:
                raise failed[0]
        finally:
            stream.close()

    def rows(self) -> list:
        """The chunks this source delivers, fetched to the driver (for reference runs and tests only)."""
        import ray

        return [ray.get(c.ref) for c in self]


class SparkSource(_SparkInput):
    """A Spark DataFrame replayed as a replistream source.

    ``time`` names the event-time column (timestamp, date, or a number in
    ``time_unit``: ``"us"``, ``"ms"``, ``"s"``, ``"min"``, ``"h"``; floating
    values are rounded to the microsecond). ``columns`` picks the payload: a
    list of column names, or ``{field: column}`` to rename; by default every
    other column. With ``sort=True`` (default) Spark sorts the rows by event
    time first (Spark's file scans do not keep file order, so an unsorted
    DataFrame replays in an arbitrary order); ``sort=False`` replays the
    DataFrame's own order, and ``max_disorder`` on the query's source
    decides which rows are too late. Pace the replay with
    ``Deployment.run(..., pace=speed)``.

    Rows travel Spark -> RayDP -> object store -> a converting Ray task ->
    the entry points, ``chunk_size`` rows at a time, at most ``prefetch``
    Spark partitions converting ahead of the feeder; they are never collected
    on the driver. ``stats`` counts rows, chunks and rejected rows by reason
    as the replay goes. A Spark job that makes no progress for
    ``stall_timeout_s`` seconds (no task finishes: an executor stopped) while
    a partition is awaited is cancelled, and the replay fails naming the
    partition; a partition's conversion that gives no chunk for
    ``read_timeout_s`` (:data:`~replistream.reading.READ_TIMEOUT_S` unless
    given) is ended and done again by a new task.

    >>> src = SparkSource(spark.read.parquet("loads/"), time="event_time")   # doctest: +SKIP
    >>> q = Query("q"); load = src.declare(q, "load", punctuate_every=seconds(1))  # doctest: +SKIP
    """

    def __init__(self, df, time: str = "ts", columns: Sequence[str] | Mapping[str, str] | None = None, *,
                 time_unit: str = "us", sort: bool = True, chunk_size: int = 10_000, string_width: int = 64,
                 on_bad_rows: str = "dead_letter", prefetch: int = 2, stall_timeout_s: float = 300.0,
                 read_timeout_s: float | None = None):
        if df.isStreaming:
            raise ValueError("SparkSource takes a batch DataFrame; use SparkStreamSource for a readStream")
        super().__init__(df, time, columns, time_unit, chunk_size, string_width, on_bad_rows, stall_timeout_s,
                         read_timeout_s)
        if int(prefetch) < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.sort = sort
        self.prefetch = int(prefetch)

    def __iter__(self) -> Iterator:
        plan = self._plan()
        prepared = self._select(self.df)
        if self.sort:
            prepared = prepared.orderBy(TS, *[f for f, _ in self.pairs])
        yield from self._chunks_of(prepared, plan, self.prefetch)


_INTERVAL_US = {"microsecond": 1, "millisecond": 1_000, "second": 1_000_000, "minute": 60_000_000,
                "hour": 3_600_000_000, "day": 86_400_000_000, "week": 604_800_000_000}


def parse_interval(text: str) -> int:
    """Microseconds in a Spark interval string such as ``"10 seconds"`` or ``"1 minute 30 seconds"``.

    >>> parse_interval("10 seconds"), parse_interval("interval 1 minute 500 milliseconds")
    (10000000, 60500000)
    """
    total, found = 0, False
    for num, unit in re.findall(r"(-?\d+(?:\.\d+)?)\s*([a-zA-Z]+)", text):
        u = unit.lower().rstrip("s")
        if u not in _INTERVAL_US:
            raise ValueError(f"cannot read the interval {text!r}: unknown unit {unit!r}")
        total += int(round(float(num) * _INTERVAL_US[u]))
        found = True
    if not found:
        raise ValueError(f"cannot read the interval {text!r}")
    return total


def spark_watermark(df) -> tuple[str, int] | None:
    """``(column, delay in µs)`` of the event-time watermark declared with ``withWatermark``, or ``None``."""
    plan = df._jdf.queryExecution().logical().toString()
    m = re.search(r"EventTimeWatermark\s+([^#\s]+)#\d+:\s*([^\n]+)", plan)
    if not m:
        return None
    return m.group(1), parse_interval(m.group(2))


class SparkStreamSource(_SparkInput):
    """A Structured Streaming DataFrame (e.g. ``spark.readStream.parquet(dir)``) feeding a source continuously.

    Each micro-batch reaches the entry points through ``foreachBatch`` and
    Ray's object store (as for :class:`SparkSource`), followed by a
    punctuation that follows Spark's event-time watermark: after micro-batch
    ``b``, ``watermark = max event time so far - delay`` and the entry points
    receive ``Punctuation(watermark - 1)``. A later row with ``ts <
    watermark``, which Spark would drop as late, is counted and dead-lettered.
    ``delay`` comes from ``withWatermark(time, delay)`` on the DataFrame or
    from ``watermark_delay`` (µs). Declare the source with
    ``punctuate_every=None`` so the micro-batch watermark alone decides
    lateness, as in Spark.

    With ``available_now=True`` (default) the query processes what is there
    and ends the stream (END); otherwise it runs until :meth:`stop`, polling
    every ``processing_time`` (a Spark interval string, e.g. ``"1 second"``).

    In a deployment a micro-batch's handler returns, and Spark commits the
    batch to ``checkpoint_location``, only once the batch has reached every
    entry replica that answers (a :class:`~replistream.sources.Handed`
    sentinel after it, run by the feeder): a restarted query with the same
    checkpoint location never skips a batch that was not safe. The handler
    waits at most ``commit_timeout`` seconds, then fails the Spark query
    loudly, naming the batch. :attr:`handed` lists the batches handed over.

    >>> stream = spark.readStream.schema(schema).parquet("incoming/").withWatermark("event_time", "5 seconds")  # doctest: +SKIP
    >>> src = SparkStreamSource(stream, time="event_time")                                                     # doctest: +SKIP
    """

    def __init__(self, df, time: str = "ts", columns: Sequence[str] | Mapping[str, str] | None = None, *,
                 time_unit: str = "us", watermark_delay: int | None = None, available_now: bool = True,
                 processing_time: str | None = None, checkpoint_location: str | None = None,
                 chunk_size: int = 10_000, string_width: int = 64, on_bad_rows: str = "dead_letter",
                 max_queued: int = 64, commit_timeout: float = 600.0, stall_timeout_s: float = 300.0,
                 read_timeout_s: float | None = None):
        if not df.isStreaming:
            raise ValueError("SparkStreamSource takes a streaming DataFrame (spark.readStream...); "
                             "use SparkSource for a batch DataFrame")
        super().__init__(df, time, columns, time_unit, chunk_size, string_width, on_bad_rows, stall_timeout_s,
                         read_timeout_s)
        declared = spark_watermark(df)
        if watermark_delay is None:
            if declared is None:
                raise ValueError("declare the event-time watermark: df.withWatermark(time_column, delay) in "
                                 "Spark, or watermark_delay=<microseconds>")
            if declared[0] != time:
                raise ValueError(f"the DataFrame's watermark is on column {declared[0]!r}, not the event-time "
                                 f"column {time!r}")
            watermark_delay = declared[1]
        if int(watermark_delay) < 0:
            raise ValueError(f"watermark_delay must be >= 0, got {watermark_delay}")
        self.delay = int(watermark_delay)
        self.available_now = available_now
        self.processing_time = processing_time
        self.checkpoint_location = checkpoint_location
        self.max_queued = int(max_queued)
        if not commit_timeout > 0:
            raise ValueError(f"commit_timeout must be a number of seconds > 0, got {commit_timeout!r}")
        self.commit_timeout = float(commit_timeout)
        self.handed: list[int] = []  # micro-batches that reached the entry replicas before Spark committed them
        self._deployed = False
        self._in_deployment = False
        self.watermark: int | None = None
        self.batches = 0
        self._query = None
        self._stop = threading.Event()

    def _on_batch(self, batch_df, batch_id: int, plan: ConversionPlan, out: "queue.Queue") -> None:
        tmax = None
        for ref in self._chunks_of(self._select(batch_df), plan, prefetch=2):
            if ref.tmax is not None:
                tmax = ref.tmax if tmax is None else max(tmax, ref.tmax)
            self._put(out, ref)
        self.batches += 1
        if tmax is not None:
            self._max_seen = tmax if self._max_seen is None else max(self._max_seen, tmax)
        if self._max_seen is not None:
            wm = self._max_seen - self.delay
            if self.watermark is None or wm > self.watermark:
                self.watermark = wm
                self._put(out, Punctuation(wm - 1))
        if self._in_deployment:  # Spark commits the batch when this returns: only once it is safe
            handed = threading.Event()
            self._put(out, Handed(handed))
            deadline = time.monotonic() + self.commit_timeout
            while not handed.wait(0.5):
                if self._stop.is_set():
                    raise RuntimeError(f"micro-batch {batch_id} was not handed to the entry points before the "
                                       "stream stopped: not committed")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"micro-batch {batch_id} did not reach the entry points within "
                                       f"commit_timeout={self.commit_timeout:g} s: not committed (Spark will "
                                       "process it again on a restart with the same checkpoint_location)")
            self.handed.append(batch_id)

    def _put(self, out: "queue.Queue", item) -> None:
        while not self._stop.is_set():
            try:
                out.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def bind(self, source: str, schema: Schema) -> None:
        """Check the columns (see :meth:`SparkSource.bind`); the next iteration feeds a deployment,
        so each micro-batch is committed only once it is safe (see the class doc)."""
        super().bind(source, schema)
        self._deployed = True

    def __iter__(self) -> Iterator:
        plan = self._plan()
        self._in_deployment, self._deployed = self._deployed, False
        self._max_seen = None
        self._stop.clear()
        out: queue.Queue = queue.Queue(maxsize=self.max_queued)
        done = object()
        errors: list = []

        def handler(batch_df, batch_id):
            try:
                self._on_batch(batch_df, batch_id, plan, out)
            except BaseException as e:  # surfaced to the feeder; Spark also fails the query
                errors.append(e)
                raise

        writer = self.df.writeStream.foreachBatch(handler)
        writer = writer.option("checkpointLocation",
                               self.checkpoint_location or tempfile.mkdtemp(prefix="replistream-stream-"))
        if self.available_now:
            writer = writer.trigger(availableNow=True)
        elif self.processing_time:
            writer = writer.trigger(processingTime=self.processing_time)
        self._query = writer.start()
        query = self._query

        def watch():
            try:
                query.awaitTermination()
            except BaseException as e:
                errors.append(e)
            finally:
                while True:
                    try:
                        out.put(done, timeout=0.5)
                        return
                    except queue.Full:
                        if self._stop.is_set():
                            try:
                                out.get_nowait()
                            except queue.Empty:
                                pass

        threading.Thread(target=watch, daemon=True, name="replistream-spark-stream").start()
        finished = False
        try:
            while True:
                item = out.get()
                if item is done:
                    finished = True
                    break
                yield item
        finally:
            if not finished:  # the consumer went away: unblock the handler and stop the query
                self._stop.set()
                query.stop()
        if errors:
            raise RuntimeError(f"the Spark streaming query feeding {plan.source!r} failed: {errors[0]}") \
                from errors[0]

    def stop(self) -> None:
        """Stop the streaming query; the source then ends (END) once what was handed over is fed."""
        if self._query is not None:
            self._query.stop()

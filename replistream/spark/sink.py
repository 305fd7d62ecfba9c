"""Application results back to Spark, through Ray Data and RayDP.

A batch (numpy structured array) becomes Arrow tables in Ray's object store
(``ts`` as a UTC timestamp with microsecond precision by default, ``id`` as
``decimal(20,0)``, the unsigned value, by default), then a Ray Dataset, then a
Spark DataFrame via RayDP (``Dataset.to_spark``), ready for Spark SQL or
``.write.parquet`` for Spark jobs downstream. :class:`SparkSink` moves an
application's output out of the driver as it arrives, under a memory budget.

>>> result = dep.run({"load": src})                       # doctest: +SKIP
>>> df = to_spark(result.outputs["alerts"])               # doctest: +SKIP
>>> sink = SparkSink(dep, "alerts"); dep.run(inputs); sink.write_parquet("out/")   # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import logging
import threading

import numpy as np
import pyarrow as pa

from ..schema import ID, TS


ID_AS = ("decimal", "long", "string")


def _check_formats(time_as: str, id_as: str) -> None:
    if time_as not in ("timestamp", "long"):
        raise ValueError(f"time_as must be 'timestamp' or 'long', got {time_as!r}")
    if id_as not in ID_AS:
        raise ValueError(f"id_as must be one of {ID_AS}, got {id_as!r}")


def to_arrow(batch: np.ndarray, time_as: str = "timestamp", id_as: str = "decimal") -> pa.Table:
    """An Arrow table of a replistream batch: ``ts`` as ``timestamp[us, UTC]`` (or int64 µs with
    ``time_as="long"``), other fields as they are, and ``id`` (a uint64) as

    * ``id_as="decimal"`` (default): ``decimal(20, 0)``, the unsigned value exactly (Spark's
      ``decimal(20,0)``; Spark has no unsigned 64-bit type);
    * ``"long"``: int64 carrying the same 64 bits (ids above 2^63 read as negative numbers; one to one);
    * ``"string"``: the unsigned value in decimal digits.

    >>> b = np.zeros(2, dtype=[("ts", "i8"), ("id", "u8"), ("x", "f8")])
    >>> b["ts"] = [1_000_000, 2_000_000]; b["id"] = [1, 2**64 - 1]
    >>> t = to_arrow(b)
    >>> str(t.schema.field("ts").type), [int(v) for v in t.column("id").to_pylist()]
    ('timestamp[us, tz=UTC]', [1, 18446744073709551615])
    >>> to_arrow(b, id_as="long").column("id").to_pylist()
    [1, -1]
    """
    _check_formats(time_as, id_as)
    cols, names = [], []
    for name in batch.dtype.names:
        v = batch[name]
        if name == TS:
            arr = pa.array(np.ascontiguousarray(v, dtype=np.int64))
            if time_as == "timestamp":
                arr = arr.cast(pa.timestamp("us", tz="UTC"))
        elif name == ID:
            ids = np.ascontiguousarray(v, dtype=np.uint64)
            if id_as == "long":
                arr = pa.array(ids.view(np.int64))
            else:
                arr = pa.array(ids).cast(pa.decimal128(20, 0) if id_as == "decimal" else pa.string())
        elif v.dtype.kind == "U":
            arr = pa.array(v.tolist(), type=pa.string())
        else:
            arr = pa.array(np.ascontiguousarray(v))
        cols.append(arr)
        names.append(name)
    return pa.Table.from_arrays(cols, names=names)


@contextlib.contextmanager
def _quiet_ray_data():
    """Ray Data logs an INFO progress report per conversion: keep it at WARNING meanwhile."""
    log = logging.getLogger("ray.data")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def _empty_dataframe(spark, table: pa.Table):
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame([], from_arrow_schema(table.schema))


def to_spark(batch: np.ndarray, spark=None, *, time_as: str = "timestamp", id_as: str = "decimal",
             rows_per_block: int = 100_000):
    """A Spark DataFrame of ``batch`` (e.g. ``result.outputs["alerts"]``), through Ray Data and RayDP.

    The rows go to Ray's object store as Arrow blocks of ``rows_per_block``
    and Spark reads them from there (``ray.data.Dataset.to_spark``).
    ``spark`` defaults to the session of :func:`~replistream.spark.spark_session`;
    ``time_as`` and ``id_as`` as in :func:`to_arrow`.

    >>> df = to_spark(result.outputs["alerts"])     # doctest: +SKIP
    >>> df.write.parquet("alerts.parquet")          # doctest: +SKIP
    """
    import ray

    from .session import spark_session

    spark = spark or spark_session()
    if rows_per_block < 1:
        raise ValueError(f"rows_per_block must be >= 1, got {rows_per_block}")
    table = to_arrow(batch, time_as, id_as)
    if table.num_rows == 0:
        return _empty_dataframe(spark, table)
    refs = [ray.put(table.slice(a, rows_per_block)) for a in range(0, table.num_rows, rows_per_block)]
    with _quiet_ray_data():
        return ray.data.from_arrow_refs(refs).to_spark(spark)


class SparkSink:
    """An application's output, as it arrives, moved out of the driver into Ray's object store
    and handed to Spark as a DataFrame or Parquet.

    Registers a callback on the deployment (:meth:`Deployment.on_output`). Arriving batches
    are buffered in the driver up to ``budget_bytes``; then the buffer becomes one Arrow
    block in Ray's object store (``ray.put``; Ray spills it to disk when memory is short)
    and leaves the driver. With ``keep_in_driver=False`` (default) the deployment keeps
    none of the application's tuples either (``run()``'s ``outputs[app]`` stays empty,
    ``stats["handed_off"]`` counts them), so the driver holds at most ``budget_bytes``
    plus one arriving batch of the result, whatever its size; ``held_peak`` records the
    most it held. :meth:`dataframe` reads the blocks into Spark (Ray Data -> RayDP), and
    :meth:`write_parquet` writes them with Spark's writer, neither through the driver.
    ``time_as`` and ``id_as`` as in :func:`to_arrow` (ids as ``decimal(20,0)`` by default).

    >>> sink = SparkSink(dep, "alerts")          # doctest: +SKIP
    >>> dep.run({"load": src})                   # doctest: +SKIP
    >>> sink.write_parquet("out/alerts")         # doctest: +SKIP
    """

    def __init__(self, deployment, app: str, spark=None, *, time_as: str = "timestamp", id_as: str = "decimal",
                 budget_bytes: int = 64 << 20, keep_in_driver: bool = False):
        _check_formats(time_as, id_as)
        if int(budget_bytes) < 1:
            raise ValueError(f"budget_bytes must be >= 1, got {budget_bytes}")
        self.app = app
        self.spark = spark
        self.time_as = time_as
        self.id_as = id_as
        self.budget_bytes = int(budget_bytes)
        self.schema = deployment.query.schema_of(app)
        self._parts: list[np.ndarray] = []  # in the driver, fewer than budget_bytes
        self._held = 0
        self.held_peak = 0  # the most bytes of the result the sink held in the driver at once
        self._blocks: list = []  # ObjectRefs of Arrow tables in Ray's object store
        self._count = 0
        self._lock = threading.Lock()
        deployment.on_output(app, self._take, keep=keep_in_driver)

    def _take(self, batch: np.ndarray) -> None:
        with self._lock:
            self._parts.append(batch)
            self._held += batch.nbytes
            self._count += len(batch)
            self.held_peak = max(self.held_peak, self._held)
            if self._held >= self.budget_bytes:
                self._flush()

    def _flush(self) -> None:
        """Move the buffered batches into the object store as one Arrow block (lock held)."""
        if not self._parts:
            return
        import ray

        table = to_arrow(np.concatenate(self._parts), self.time_as, self.id_as)
        self._blocks.append(ray.put(table))
        self._parts, self._held = [], 0

    @property
    def count(self) -> int:
        """Tuples received so far."""
        with self._lock:
            return self._count

    @property
    def blocks(self) -> list:
        """ObjectRefs of the Arrow tables holding everything received so far (flushes the buffer)."""
        with self._lock:
            self._flush()
            return list(self._blocks)

    def batch(self) -> np.ndarray:
        """Everything received so far, as one numpy batch *in the driver* (for small results and tests)."""
        import ray

        tables = ray.get(self.blocks)
        if not tables:
            return self.schema.empty()
        out = self.schema.empty()
        parts = []
        for t in tables:
            part = np.zeros(t.num_rows, dtype=out.dtype)
            for name in out.dtype.names:
                col = t.column(name)
                if name == TS and pa.types.is_timestamp(col.type):
                    col = col.cast(pa.int64())
                if name == ID:
                    vals = col.to_pylist() if self.id_as != "long" else None
                    part[name] = np.array([int(v) for v in vals], dtype=np.uint64) if vals is not None \
                        else col.to_numpy().view(np.uint64)
                else:
                    part[name] = col.to_numpy(zero_copy_only=False)
            parts.append(part)
        return np.concatenate(parts)

    def dataframe(self):
        """Everything received so far, as a Spark DataFrame read from Ray's object store."""
        import ray

        from .session import spark_session

        spark = self.spark or spark_session()
        refs = self.blocks
        if not refs:
            return _empty_dataframe(spark, to_arrow(self.schema.empty(), self.time_as, self.id_as))
        with _quiet_ray_data():
            return ray.data.from_arrow_refs(refs).to_spark(spark)

    def write_parquet(self, path: str, mode: str = "overwrite") -> str:
        """Write everything received so far as Parquet at ``path`` (Spark's writer); returns ``path``."""
        self.dataframe().write.mode(mode).parquet(path)
        return path

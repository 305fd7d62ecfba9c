"""Application results back to Spark, through Ray Data and RayDP.

A batch (numpy structured array) becomes Arrow tables in Ray's object store
(``ts`` as a UTC timestamp with microsecond precision by default, ``id`` as
Spark's signed 64-bit long holding the same 64 bits), then a Ray Dataset,
then a Spark DataFrame via RayDP (``Dataset.to_spark``), ready for Spark SQL
or ``.write.parquet`` for Spark jobs downstream.

>>> result = dep.run({"load": src})                       # doctest: +SKIP
>>> df = to_spark(result.outputs["alerts"])               # doctest: +SKIP
>>> sink = SparkSink(dep, "alerts"); dep.run(inputs); sink.write_parquet("out/")   # doctest: +SKIP
"""
from __future__ import annotations

import logging
import threading

import numpy as np
import pyarrow as pa

from ..schema import ID, TS


def to_arrow(batch: np.ndarray, time_as: str = "timestamp") -> pa.Table:
    """An Arrow table of a replistream batch: ``ts`` as ``timestamp[us, UTC]`` (or int64 µs with
    ``time_as="long"``), ``id`` as int64 carrying the uint64 id's bits, other fields as they are.

    >>> b = np.zeros(2, dtype=[("ts", "i8"), ("id", "u8"), ("x", "f8")])
    >>> b["ts"] = [1_000_000, 2_000_000]; b["id"] = [1, 2**64 - 1]
    >>> t = to_arrow(b)
    >>> str(t.schema.field("ts").type), t.column("id").to_pylist()
    ('timestamp[us, tz=UTC]', [1, -1])
    """
    if time_as not in ("timestamp", "long"):
        raise ValueError(f"time_as must be 'timestamp' or 'long', got {time_as!r}")
    cols, names = [], []
    for name in batch.dtype.names:
        v = batch[name]
        if name == TS:
            arr = pa.array(np.ascontiguousarray(v, dtype=np.int64))
            if time_as == "timestamp":
                arr = arr.cast(pa.timestamp("us", tz="UTC"))
        elif name == ID:
            arr = pa.array(np.ascontiguousarray(v).view(np.int64))
        elif v.dtype.kind == "U":
            arr = pa.array(v.tolist(), type=pa.string())
        else:
            arr = pa.array(np.ascontiguousarray(v))
        cols.append(arr)
        names.append(name)
    return pa.Table.from_arrays(cols, names=names)


def to_spark(batch: np.ndarray, spark=None, *, time_as: str = "timestamp", rows_per_block: int = 100_000):
    """A Spark DataFrame of ``batch`` (e.g. ``result.outputs[app]``), through Ray Data and RayDP.

    The rows go to Ray's object store as Arrow blocks of ``rows_per_block``
    and Spark reads them from there (``ray.data.Dataset.to_spark``).
    ``spark`` defaults to the session of :func:`~replistream.spark.spark_session`.

    >>> df = to_spark(result.outputs["alerts"])     # doctest: +SKIP
    >>> df.write.parquet("alerts.parquet")          # doctest: +SKIP
    """
    import ray

    from .session import spark_session

    spark = spark or spark_session()
    if rows_per_block < 1:
        raise ValueError(f"rows_per_block must be >= 1, got {rows_per_block}")
    table = to_arrow(batch, time_as)
    if table.num_rows == 0:
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.createDataFrame([], from_arrow_schema(table.schema))
    refs = [ray.put(table.slice(a, rows_per_block)) for a in range(0, table.num_rows, rows_per_block)]
    log = logging.getLogger("ray.data")
    level = log.level
    log.setLevel(logging.WARNING)  # Ray Data logs an INFO progress report per conversion
    try:
        return ray.data.from_arrow_refs(refs).to_spark(spark)
    finally:
        log.setLevel(level)


class SparkSink:
    """Collect an application's output as it arrives and hand it to Spark as a DataFrame.

    Registers a callback on the deployment (:meth:`Deployment.on_output`), so
    the results accumulate while the query runs; :meth:`dataframe` gives
    everything received so far, :meth:`write_parquet` writes it for Spark
    jobs downstream.

    >>> sink = SparkSink(dep, "alerts")          # doctest: +SKIP
    >>> dep.run({"load": src})                   # doctest: +SKIP
    >>> sink.write_parquet("out/alerts")         # doctest: +SKIP
    """

    def __init__(self, deployment, app: str, spark=None, *, time_as: str = "timestamp"):
        self.app = app
        self.spark = spark
        self.time_as = time_as
        self.schema = deployment.query.schema_of(app)
        self._parts: list[np.ndarray] = []
        self._lock = threading.Lock()
        deployment.on_output(app, self._take)

    def _take(self, batch: np.ndarray) -> None:
        with self._lock:
            self._parts.append(batch)

    @property
    def count(self) -> int:
        """Tuples received so far."""
        with self._lock:
            return sum(len(p) for p in self._parts)

    def batch(self) -> np.ndarray:
        """Everything received so far, as one numpy batch."""
        with self._lock:
            return np.concatenate(self._parts) if self._parts else self.schema.empty()

    def dataframe(self):
        """Everything received so far, as a Spark DataFrame."""
        return to_spark(self.batch(), self.spark, time_as=self.time_as)

    def write_parquet(self, path: str, mode: str = "overwrite") -> str:
        """Write everything received so far as Parquet at ``path`` (Spark's writer); returns ``path``."""
        self.dataframe().write.mode(mode).parquet(path)
        return path

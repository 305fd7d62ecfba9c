"""A ParquetSink folder reads as a Spark DataFrame (#44 point 6): ``spark.read.parquet(folder)``
gives the application's fields with their declared names and types (and the run's ``ts`` and tuple
``id``), the same rows the sink's ``read()`` gives; the marker and the run record are not read as
data (Spark skips ``_`` names)."""
from __future__ import annotations

import numpy as np
import pytest

from replistream import ParquetSink, Query, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.mark.slow  # the shared Spark session's start (the first Spark test pays it)
def test_a_sink_folder_reads_as_a_spark_dataframe(spark, tmp_path):
    q = Query("to_spark")
    s = q.source("s", {"server": "U16", "cpu": "f8", "n": "i4", "up": "?", "k": "i8"}, punctuate_every=100)
    s.sink("out")
    q = q.build()
    n = 50
    data = {"s": [{"ts": np.arange(n) * 10, "server": np.array([f"s{i % 4}" for i in range(n)]),
                   "cpu": np.linspace(0, 1, n), "n": np.arange(n, dtype="i4"), "up": np.arange(n) % 2 == 0,
                   "k": np.arange(n) * 7}]}
    sink = ParquetSink(str(tmp_path / "out"), every=200)
    sink.write_result(q, "out", run_reference(q, data).outputs["out"])
    df = spark.read.parquet(sink.path)
    types = dict(df.dtypes)
    assert types == {"ts": "bigint", "id": "decimal(20,0)", "server": "string", "cpu": "double", "n": "int",
                     "up": "boolean", "k": "bigint"}
    assert df.count() == len(sink)
    got = sorted((r["ts"], r["server"], r["cpu"], r["n"], r["up"], r["k"]) for r in df.collect())
    rows = sink.read()
    want = sorted(zip(rows["ts"].tolist(), rows["server"].tolist(), rows["cpu"].tolist(), rows["n"].tolist(),
                      rows["up"].tolist(), rows["k"].tolist()))
    assert got == want

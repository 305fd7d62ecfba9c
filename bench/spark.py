"""Spark -> entry points throughput against RayDP's own path, and Spark start-up (a benchmark, not a test).

    python bench/spark.py                 # 2M rows, 3 repetitions, about 3 minutes
    python bench/spark.py --rows 200000   # smaller
    python bench/spark.py --json          # one JSON object on stdout

One local Ray instance (``init_ray(num_cpus=2)``) and one Spark session on it
(``replistream.spark.spark_session()``: 1 executor, 1 core, 1 GB) serve every
measurement.

* **Start-up**: wall time of ``spark_session()`` (RayDP app master, one
  executor, the JVM driver), measured once, in this fresh process.
* **Data**: ``spark.range(0, rows, numPartitions=partitions)`` (contiguous
  ranges, so in event-time order) with ``t = id * 1000`` (µs), ``server = id %
  100`` (int) and ``cpu = rand(seed)`` (double), cached in Spark and counted
  once before timing, so every repetition reads the same rows from Spark's cache.
* **Limit** (the issue's baseline): ``ray.data.from_spark(df).iter_batches(batch_format="numpy",
  batch_size=None)`` consuming every row in the driver: rows / wall time.
* **replistream**: a query ``source -> filter(cpu > 2) -> application``
  (the filter passes nothing, so downstream cost is negligible) deployed with
  ``k`` entry-point replicas before the clock starts; timed from
  ``dep.feed({"load": SparkSource(df, time="t", sort=False)})`` until every
  application holds END: every row converted by Ray tasks, handed to every
  entry replica, checked, stamped with ids, punctuated and forwarded.
  ``sort=False`` because the data are already in event-time order; with
  ``sort=True`` (the default) Spark sorts first, reported separately.

* **First chunk** (issue #18: partitions streamed): the same rows *not* cached
  (Spark computes them while the source reads), ``SparkSource(sort=False)``
  iterated in the driver without a deployment: seconds to the first chunk
  and to the last, per repetition.

Repetitions alternate the two paths; the table reports the best of each
(the machine is shared) and the ratio replistream / limit.
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import replistream as rs
from replistream.engines.ray.deployment import init_ray


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--k", type=int, default=2, help="entry-point replicas (default 2)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import ray

    init_ray(num_cpus=2)
    from replistream.spark import SparkSource, spark_session

    t = time.time()
    spark = spark_session(app_name="replistream-bench")
    startup = time.time() - t
    from pyspark.sql import functions as F

    df = (spark.range(0, args.rows, numPartitions=args.partitions)  # contiguous ranges: in event-time order
          .select((F.col("id") * 1000).alias("t"), (F.col("id") % 100).cast("int").alias("server"),
                  F.rand(1).alias("cpu"))
          .cache())
    assert df.count() == args.rows

    q = rs.Query("spark_bench")
    src = q.source("load", {"server": "i4", "cpu": "f8"}, punctuate_every=1_000_000)
    src.filter(lambda b: b["cpu"] > 2.0, name="none").sink("out")
    q.build()

    def raw() -> float:
        t0 = time.time()
        ds = ray.data.from_spark(df, parallelism=None)
        n = sum(len(b["t"]) for b in ds.iter_batches(batch_format="numpy", batch_size=None))
        assert n == args.rows, n
        return args.rows / (time.time() - t0)

    def ours(sort: bool) -> float:
        with rs.deploy(q, servers=max(2, args.k), k=args.k) as dep:
            s = SparkSource(df, time="t", sort=sort)
            t0 = time.time()
            dep.feed({"load": s})
            assert dep.wait(timeout=1200), "did not finish"
            rate = args.rows / (time.time() - t0)
            assert s.stats["rows"] == args.rows
            assert dep.collect().dead_letter_count() == 0  # nothing late or malformed
        return rate

    def first_chunk(seed: int) -> tuple[float, float]:
        fresh = spark.range(0, args.rows, numPartitions=args.partitions).select(
            (F.col("id") * 1000).alias("t"), (F.col("id") % 100).cast("int").alias("server"),
            F.rand(seed).alias("cpu"))
        s = SparkSource(fresh, time="t", sort=False)
        t0, first, n = time.time(), None, 0
        for c in s:
            first = time.time() - t0 if first is None else first
            n += c.n
        assert n == args.rows, n
        return first, time.time() - t0

    firsts = [first_chunk(seed) for seed in range(args.reps)]
    raws, unsorted, sorted_ = [], [], []
    for _ in range(args.reps):
        raws.append(raw())
        unsorted.append(ours(False))
    sorted_.append(ours(True))
    best_raw, best_ours = max(raws), max(unsorted)
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}",
        "rows": args.rows, "partitions": args.partitions, "k": args.k,
        "spark_startup_s": round(startup, 1),
        "limit_rows_per_s": [round(r) for r in raws],
        "replistream_rows_per_s": [round(r) for r in unsorted],
        "replistream_sorted_rows_per_s": [round(r) for r in sorted_],
        "ratio_best": round(best_ours / best_raw, 3),
        "ratio_per_repetition": [round(o / r, 3) for o, r in zip(unsorted, raws)],
        "uncached_first_chunk_s": [round(f, 3) for f, _ in firsts],
        "uncached_last_chunk_s": [round(a, 3) for _, a in firsts],
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"Spark start-up: {startup:.1f} s")
        print(f"limit (from_spark + iter_batches): best {best_raw:,.0f} rows/s {report['limit_rows_per_s']}")
        print(f"replistream into k={args.k} entry points: best {best_ours:,.0f} rows/s "
              f"{report['replistream_rows_per_s']} ({report['ratio_best']:.0%} of the limit)")
        print(f"with Spark sorting first (sort=True): {report['replistream_sorted_rows_per_s']}")
        print(f"uncached, first chunk after {report['uncached_first_chunk_s']} s, "
              f"last after {report['uncached_last_chunk_s']} s")
    return report


if __name__ == "__main__":
    main()

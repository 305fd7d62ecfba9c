"""Spark -> replicated Fig. 1 query on Ray -> Spark, checked against Spark SQL.

1. A generator writes the Fig. 1 monitoring readings (CPU load and ping
   latency of N servers) as Parquet, with some dirt: duplicated rows, missing
   readings and impossible values.
2. Spark (on Ray, through RayDP) reads and cleans them.
3. The Fig. 1 query (Hwang §II-B) runs on Ray with k=2 replicas of every
   operator, fed from the cleaned DataFrames; the server of one Join replica
   crashes halfway through the readings (``inject_at``: after every earlier
   reading has reached the entry points, whatever the machine's speed).
4. The alerts come back as a Spark DataFrame, are written as Parquet, and are
   compared in Spark with a Spark SQL batch computation of the same windowed
   join and filter: they must match exactly (as multisets).

Run: python examples/spark_pipeline.py [--servers 4 --duration 60 --out DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import replistream as rs
from replistream.schema import seconds
from replistream.spark import SparkSink, SparkSource, spark_session
from replistream.testing import Call, KillServer, inject_at
from replistream.workloads import FIG1_EPOCH_US, fig1_query, fig1_tables


def write_readings(out: Path, n_servers: int, duration_s: float, period_s: float, seed: int) -> dict:
    """Write loads/ and pings/ as Parquet (one file per server), with dirt to clean; returns row counts."""
    tables = fig1_tables(n_servers, duration_s, period_s, seed=seed)
    rng = np.random.default_rng(seed + 1)
    counts = {}
    for name, table in tables.items():
        n = table.num_rows
        dirty = [table]
        dup = rng.choice(n, max(1, n // 50), replace=False)  # re-sent readings
        dirty.append(table.take(dup))
        broken = table.take(rng.choice(n, max(1, n // 50), replace=False)).to_pydict()
        value = "cpu" if name == "loads" else "rtt_ms"
        broken[value] = [None if i % 2 else -1.0 for i in range(len(broken[value]))]  # lost or impossible
        dirty.append(pa.table(broken, schema=table.schema))
        full = pa.concat_tables(dirty)
        key = "server" if name == "loads" else "src"
        (out / name).mkdir(parents=True, exist_ok=True)
        for s in range(n_servers):
            part = full.filter(pa.compute.equal(full[key], s))
            pq.write_table(part, out / name / f"server-{s}.parquet")
        counts[name] = {"clean": n, "written": full.num_rows}
    return counts


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=4, help="monitored servers (default 4)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of readings (default 60)")
    ap.add_argument("--period", type=float, default=1.0, help="seconds between readings (default 1)")
    ap.add_argument("--pace", type=float, default=10.0, help="replay speed-up over event time (default 10)")
    ap.add_argument("--window", type=float, default=10.0, help="join window in seconds (default 10)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="replistream-spark-"))
    started = time.time()

    def say(text: str) -> None:  # progress on stderr (stdout is the report)
        print(f"{time.time() - started:6.1f} s  {text}", file=sys.stderr, flush=True)

    say(f"writing {args.duration:g} s of readings of {args.servers} servers as Parquet in {out}")

    # 1. raw readings as Parquet
    written = write_readings(out, args.servers, args.duration, args.period, args.seed)

    # 2. Spark on Ray reads and cleans them
    say("starting Ray and Spark (RayDP) ...")
    spark = spark_session()
    say("Spark up; reading and cleaning the readings")
    from pyspark.sql import functions as F

    loads = (spark.read.parquet(str(out / "loads")).dropna().dropDuplicates()
             .where(F.col("cpu").between(0.0, 1.0)).cache())
    pings = (spark.read.parquet(str(out / "pings")).dropna().dropDuplicates()
             .where(F.col("rtt_ms") >= 0.0).cache())
    cleaned = {"loads": loads.count(), "pings": pings.count()}
    phases = {"write_and_clean": time.time() - started}

    # 3. the replicated Fig. 1 query, fed from Spark, with a server crash mid-run
    cpu_thr, rtt_thr = 0.2, 60.0
    q = fig1_query(args.servers, window_s=args.window, cpu_threshold=cpu_thr, rtt_threshold_ms=rtt_thr)
    crashed = []
    t = time.time()
    say(f"cleaned: {cleaned['loads']:,} loads, {cleaned['pings']:,} pings; "
        f"deploying the Fig. 1 query, k=2 on 6 servers")
    with rs.deploy(q, servers=6, k=2, network="geo-static", seed=args.seed) as dep:
        victim = dep.plan["correlate"][0]
        inputs = {}
        for i in range(args.servers):
            inputs[f"load_{i}"] = SparkSource(loads.where(F.col("server") == i), time="event_time",
                                              columns=["server", "cpu"], chunk_size=8)
            inputs[f"ping_{i}"] = SparkSource(pings.where(F.col("src") == i), time="event_time",
                                              columns=["src", "dst", "rtt_ms"], chunk_size=8)
        # the crash lands halfway through the readings, after all earlier input reached the entry points
        halfway = FIG1_EPOCH_US + seconds(args.duration / 2)
        note = Call(lambda d: crashed.append({"server": victim, "at_s": args.duration / 2,
                                              "alerts_before": sink.count}))
        inputs["load_0"] = inject_at(inputs["load_0"], halfway, note, KillServer(victim))
        sink = SparkSink(dep, "alerts")
        phases["deploy"] = time.time() - t
        t = time.time()
        say(f"replaying at {args.pace:g}x event time from Spark; the server of one join replica crashes halfway")
        dep.feed(inputs, pace=args.pace)
        shown = [time.time()]

        def progress(counts):
            if time.time() - shown[0] >= 3.0:
                shown[0] = time.time()
                say(f"{counts.get('alerts', 0):,} alerts so far")

        if not dep.wait(timeout=600, progress=progress):
            raise SystemExit("the replicated query did not finish within 600 s")
        res = dep.collect()
        phases["run"] = time.time() - t
        t = time.time()
        say(f"{sink.count:,} alerts; writing them as Parquet and checking them in Spark SQL")
        sink.write_parquet(str(out / "alerts"))
    dead_letters = res.dead_letter_count()

    # 4. back in Spark: the replicated alerts against Spark SQL's batch join of the same data
    alerts = spark.read.parquet(str(out / "alerts")).select("ts", "server", "cpu", "src", "dst", "rtt_ms")
    loads.createOrReplaceTempView("loads")
    pings.createOrReplaceTempView("pings")
    expected = spark.sql(f"""
        SELECT greatest(l.event_time, p.event_time) AS ts, l.server, l.cpu, p.src, p.dst, p.rtt_ms
        FROM loads l JOIN pings p
          ON l.server = p.src
         AND abs(unix_micros(l.event_time) - unix_micros(p.event_time)) < {seconds(args.window)}
        WHERE l.cpu > {cpu_thr} AND p.rtt_ms > {rtt_thr}""")
    lost = expected.exceptAll(alerts).count()
    extra = alerts.exceptAll(expected).count()
    n_alerts, n_expected = alerts.count(), expected.count()
    phases["write_and_check"] = time.time() - t
    report = {
        "readings_written": {k: v["written"] for k, v in written.items()},
        "readings_after_cleaning": cleaned,
        "alerts_replicated": n_alerts,
        "alerts_spark_sql": n_expected,
        "lost": lost,
        "extra": extra,
        "dead_letters": dead_letters,
        "crash": crashed[0] if crashed else None,
        "exact_match": lost == 0 and extra == 0 and n_alerts == n_expected,
        "seconds": round(time.time() - started, 1),
        "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
        "output": str(out / "alerts"),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for k, v in report.items():
            print(f"{k:>24}: {v}")
        print("EXACT MATCH with Spark SQL" if report["exact_match"] else "MISMATCH with Spark SQL")
    if not report["exact_match"]:
        raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()

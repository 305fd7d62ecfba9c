"""Spark through RayDP: sources from DataFrames and streams, results back to Spark (one shared session)."""
from __future__ import annotations

import datetime as dt
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import replistream as rs
from replistream.errors import SchemaError
from replistream.schema import Punctuation
from replistream.spark import SparkSink, SparkSource, SparkStreamSource, spark_session, to_spark
from replistream.testing import assert_same_output

pytestmark = pytest.mark.usefixtures("ray_session")

EPOCH = dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc)
EPOCH_US = int(EPOCH.timestamp() * 1_000_000)


def readings(n: int, seed: int = 0, start_us: int = 0, step_us: int = 1_000):
    """n load readings with unique, increasing event times (so every order agrees) and random payloads."""
    rng = np.random.default_rng(seed)
    t = start_us + step_us * np.arange(n, dtype=np.int64) + rng.integers(0, step_us // 2, n)
    return {"t": t, "server": rng.integers(0, 4, n).astype(np.int32), "cpu": np.round(rng.random(n), 4)}


def load_query(window_us: int = 200_000):
    q = rs.Query("spark_load")
    load = q.source("load", {"server": "i4", "cpu": "f8"}, punctuate_every=window_us, max_disorder=0)
    load.window(size=window_us, by="server", aggs={"n": "count", "avg": ("cpu", "mean")}, name="per_server").sink("avg")
    load.filter(lambda b: b["cpu"] > 0.9, name="busy").sink("hot")
    return q.build()


def records(cols):
    return [{"ts": int(t), "server": int(s), "cpu": float(c)} for t, s, c in zip(cols["t"], cols["server"], cols["cpu"])]


def test_one_session_is_shared(spark):
    assert spark_session() is spark
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert "--add-opens=java.base/java.nio=ALL-UNNAMED" in spark.sparkContext.getConf().get(
        "spark.ray.raydp_app_master.extraJavaOptions")


@pytest.mark.slow
def test_python_workers_run_this_interpreter(spark):
    """Spark's Python workers start sys.executable, not the first python3 on PATH (#17: an unactivated
    virtual environment otherwise fails inside Spark with an EOFException from pyspark.daemon)."""
    import sys

    assert spark.conf.get("spark.pyspark.python") == sys.executable
    assert spark.sparkContext.parallelize([1, 2, 3], 2).map(lambda x: __import__("sys").executable).distinct() \
        .collect() == [sys.executable]


@pytest.mark.slow
def test_parquet_timestamps_paced_replay_with_a_crash_equals_the_reference(spark, tmp_path):
    cols = readings(3000, seed=1, start_us=EPOCH_US)
    table = pa.table({"event_time": pa.array(cols["t"], pa.timestamp("us", tz="UTC")),
                      "server": cols["server"], "cpu": cols["cpu"], "note": ["x"] * len(cols["t"])})
    for i, part in enumerate(range(0, 3000, 1000)):  # three files: Spark's scan order is not file order
        pq.write_table(table.slice(part, 1000), tmp_path / f"part-{i}.parquet")
    df = spark.read.parquet(str(tmp_path))
    src = SparkSource(df, time="event_time", columns=["server", "cpu"], chunk_size=500)
    q = load_query()
    killed = []

    def crash_after_first_output(counts):
        if counts["avg"] and not killed:
            dep.kill_replica("per_server", 0)  # a crash mid-run
            killed.append(sum(counts.values()))

    with rs.deploy(q, servers=3, k=2) as dep:
        dep.feed({"load": src}, pace=2.0)  # 3 s of epoch-stamped event time, replayed in about 1.5 s
        assert dep.wait(300, progress=crash_after_first_output)
        res = dep.collect()
        lat = dep.latencies_ms("avg")[1]
    ref = rs.run_reference(q, {"load": records(cols)})
    assert res.complete and len(ref.outputs["avg"]) > 20
    assert killed and killed[0] < len(ref.outputs["avg"]) + len(ref.outputs["hot"])  # it was mid-run
    for app in ("avg", "hot"):
        assert_same_output(ref.outputs[app], res.outputs[app])
    assert src.stats == {"rows": 3000, "chunks": src.stats["chunks"], "rejected": {}}
    assert np.isfinite(lat).all()  # paced from the first epoch timestamp, not from 1970


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_csv_and_json_sources_deliver_the_rows_in_event_time_order(spark, tmp_path, fmt):
    cols = readings(400, seed=2)
    order = np.random.default_rng(3).permutation(400)  # files hold the rows shuffled
    rows = [{"t": int(cols["t"][i]), "server": int(cols["server"][i]), "cpu": float(cols["cpu"][i])} for i in order]
    path = str(tmp_path / fmt)
    sdf = spark.createDataFrame(rows, "t long, server int, cpu double")
    getattr(sdf.write.option("header", True), fmt)(path)
    reader = spark.read.schema("t long, server int, cpu double")
    df = reader.option("header", True).csv(path) if fmt == "csv" else reader.json(path)
    src = SparkSource(df, time="t", time_unit="us")
    src.bind("load", rs.Schema({"server": "i4", "cpu": "f8"}))
    got = np.concatenate([c.data for c in src.rows()])
    assert got["ts"].tolist() == cols["t"].tolist()
    assert got["server"].tolist() == cols["server"].tolist() and got["cpu"].tolist() == cols["cpu"].tolist()


@pytest.mark.slow
def test_bad_columns_are_refused_before_the_stream_starts(spark):
    df = spark.createDataFrame([("1", 1, "0.5", "a")], "t string, server int, cpu string, s string")
    with pytest.raises(SchemaError, match="event-time column 't' has Spark type string"):
        SparkSource(df, time="t")
    with pytest.raises(SchemaError, match=r"event-time column 'when' is not in the DataFrame"):
        SparkSource(df, time="when")
    good_time = df.selectExpr("cast(t as long) as t", "server", "cpu", "s")
    with pytest.raises(SchemaError, match=r"column\(s\) \['cpux'\] not in the DataFrame"):
        SparkSource(good_time, time="t", columns=["server", "cpux"])
    with pytest.raises(SchemaError, match="would become field 'id'"):
        SparkSource(good_time.withColumnRenamed("s", "id"), time="t")
    src = SparkSource(good_time, time="t", columns=["server", "cpu"])
    q = load_query()
    with rs.deploy(q, servers=2, k=2) as dep:
        with pytest.raises(SchemaError, match="column 'cpu' has Spark type string but field 'cpu' is float64"):
            dep.feed({"load": src})
        with pytest.raises(SchemaError, match=r"needs field\(s\) \['cpu'\]"):
            dep.feed({"load": SparkSource(good_time, time="t", columns=["server"])})
        assert not dep.fed  # nothing was sent


@pytest.mark.slow
def test_nulls_and_late_rows_are_dead_lettered_and_counted(spark):
    q = rs.Query("late")
    load = q.source("load", {"server": "i4", "cpu": "f8"}, punctuate_every=100, max_disorder=50)
    load.window(size=100, by="server", aggs={"n": "count"}).sink("counts")
    q.build()
    rows = [(t, t % 3, t / 1000) for t in range(0, 1000, 7)]
    rows.insert(40, (150, 1, 0.3))  # after ts 273 the punctuation in force is 199: late
    rows.insert(10, (None, 2, 0.5))  # null event time
    rows.insert(20, (150, None, 0.5))  # null payload
    df = spark.createDataFrame(rows, "t long, server int, cpu double").coalesce(1)
    src = SparkSource(df, time="t", sort=False, chunk_size=64)
    with rs.deploy(q, servers=2, k=2) as dep:
        res = dep.run({"load": src}, timeout=300)
    ref = rs.run_reference(q, {"load": [{"ts": t, "server": s, "cpu": c} for t, s, c in rows]},
                           on_malformed="dead_letter")
    assert res.complete
    assert_same_output(ref.outputs["counts"], res.outputs["counts"])
    assert src.stats["rejected"] == {"event time 'ts' is null": 1, "column 'server' is null": 1}
    reasons = sorted((d.reason, d.count) for d in res.dead_letters)
    assert reasons == [("late: ts <= punctuation in force", 1), ("malformed: column 'server' is null", 1),
                       ("malformed: event time 'ts' is null", 1)]
    assert res.dead_letter_count() == sum(d.count for d in ref.dead_letters) == 3


@pytest.mark.slow
def test_streaming_micro_batches_follow_the_spark_watermark(spark, tmp_path):
    """Three files, one per micro-batch; the third holds a row Spark would drop as late."""
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    batches = [[(t, t % 2, 0.1) for t in range(0, 1000, 50)],
               [(t, t % 2, 0.2) for t in range(1000, 2000, 50)],
               [(1500, 1, 0.9)] + [(t, t % 2, 0.3) for t in range(2000, 3000, 50)]]
    for i, b in enumerate(batches):
        p = incoming / f"batch-{i}.parquet"
        pq.write_table(pa.table({"t": [r[0] for r in b], "server": pa.array([r[1] for r in b], pa.int32()),
                                 "cpu": [r[2] for r in b]}), p)
        os.utime(p, (1_700_000_000 + i, 1_700_000_000 + i))  # the file source takes files by age
    q = rs.Query("stream")
    load = q.source("load", {"server": "i4", "cpu": "f8"}, punctuate_every=None, max_disorder=0)
    load.window(size=500, by="server", aggs={"n": "count", "avg": ("cpu", "mean")}).sink("avg")
    q.build()
    stream = (spark.readStream.schema("t long, server int, cpu double").option("maxFilesPerTrigger", 1)
              .parquet(str(incoming)))
    src = SparkStreamSource(stream, time="t", watermark_delay=200)
    with rs.deploy(q, servers=2, k=2) as dep:
        res = dep.run({"load": src}, timeout=300)
    # Spark's rule: after batch b, watermark = max event time so far - delay; rows below it are late
    expected_input = [batches[0], Punctuation(950 - 200 - 1), batches[1], Punctuation(1950 - 200 - 1),
                      batches[2], Punctuation(2950 - 200 - 1)]
    ref = rs.run_reference(q, {"load": [[{"ts": t, "server": s, "cpu": c} for t, s, c in b]
                                        if isinstance(b, list) else b for b in expected_input]})
    assert res.complete and src.batches == 3 and src.watermark == 2750
    assert src.handed == [0, 1, 2]  # each batch reached the entry replicas before Spark committed it
    assert_same_output(ref.outputs["avg"], res.outputs["avg"])
    assert [(d.reason, d.batch["ts"].tolist()) for d in res.dead_letters] == [
        ("late: ts <= punctuation in force", [1500])]


@pytest.mark.slow
def test_results_return_to_spark_and_parquet(spark, tmp_path):
    cols = readings(500, seed=4)
    q = load_query()
    df = spark.createDataFrame([(int(t), int(s), float(c)) for t, s, c in zip(cols["t"], cols["server"], cols["cpu"])],
                               "t long, server int, cpu double")
    with rs.deploy(q, servers=2, k=2) as dep:
        sink = SparkSink(dep, "avg")
        res = dep.run({"load": SparkSource(df, time="t")})
        out = sink.write_parquet(str(tmp_path / "avg"))
    exp = rs.run_reference(q, {"load": records(cols)}).outputs["avg"]
    assert res.complete and len(res.outputs["avg"]) == 0  # the sink took them out of the driver
    assert sink.count == res.stats["handed_off"]["avg"] == len(exp) > 0
    assert_same_output(exp, sink.batch())
    back = spark.read.parquet(out)
    assert dict(back.dtypes)["ts"] == "timestamp" and dict(back.dtypes)["id"] == "decimal(20,0)"
    got = sorted(back.selectExpr("unix_micros(ts) as ts", "cast(id as string) as id", "server", "window_start",
                                 "n", "avg").collect())
    want = sorted(zip(exp["ts"].tolist(), [str(i) for i in exp["id"].tolist()], exp["server"].tolist(),
                      exp["window_start"].tolist(), exp["n"].tolist(), exp["avg"].tolist()))
    assert [tuple(r) for r in got] == want
    assert max(exp["id"].tolist()) >= 2**63  # an id Spark's bigint would have shown as negative
    empty = to_spark(q.schema_of("hot").empty())
    assert empty.count() == 0 and "cpu" in empty.columns
    longs = to_spark(exp, id_as="long")
    assert dict(longs.dtypes)["id"] == "bigint"
    assert sorted(r.id for r in longs.select("id").collect()) == sorted(exp["id"].view(np.int64).tolist())


@pytest.mark.slow
def test_spark_sink_holds_at_most_its_budget_in_the_driver(spark, tmp_path):
    """A result of about 1 MB through a sink with a 64 KB budget: the driver never holds more than the
    budget plus the batch arriving, and Spark reads the whole result exactly (#18)."""
    n = 30_000
    rng = np.random.default_rng(8)
    cols = {"ts": np.arange(n, dtype=np.int64) * 10, "server": rng.integers(0, 50, n).astype(np.int32),
            "cpu": rng.random(n)}
    q = rs.Query("wide")
    q.source("load", {"server": "i4", "cpu": "f8"}, punctuate_every=10_000).filter(
        lambda b: b["cpu"] >= 0, name="every").sink("all")
    q.build()
    budget = 64 * 1024
    arriving = []
    with rs.deploy(q, servers=2, k=2) as dep:
        dep.on_output("all", lambda b: arriving.append(b.nbytes))
        sink = SparkSink(dep, "all", budget_bytes=budget)
        # paced over ~6 s, so the driver fetches the result in many polls, not in one or two
        res = dep.run({"load": cols}, chunk_size=1_000, pace=0.05)
        out = sink.write_parquet(str(tmp_path / "all"))
    exp = rs.run_reference(q, {"load": cols}).outputs["all"]
    total = exp.nbytes
    assert res.complete and total > 10 * budget
    assert res.stats["handed_off"]["all"] == sink.count == n and len(res.outputs["all"]) == 0
    assert sink.held_peak <= budget + max(arriving) < total / 2
    assert len(sink.blocks) >= total // (budget + max(arriving))
    back = spark.read.parquet(out)
    got = sorted(back.selectExpr("unix_micros(ts)", "cast(id as string)", "server", "cpu").collect())
    want = sorted(zip(exp["ts"].tolist(), [str(i) for i in exp["id"].tolist()], exp["server"].tolist(),
                      exp["cpu"].tolist()))
    assert [tuple(r) for r in got] == want


@pytest.mark.slow
def test_a_batch_source_streams_partition_by_partition(spark, tmp_path):
    """The first chunk leaves Spark before the last partition is read (#18): the last partition's
    last row waits for a gate that is opened only once the first chunk is in the object store.
    Reading the whole DataFrame first would wait 30 s for the gate and then mark the timeout."""
    import time

    import ray
    from pyspark.sql import functions as F

    gate, late = str(tmp_path / "gate"), str(tmp_path / "timed_out")
    n, parts = 2_000, 4

    def gated(i):
        if i == n - 1:  # the last row of the last partition
            deadline = time.time() + 30
            while not os.path.exists(gate) and time.time() < deadline:
                time.sleep(0.01)
            if not os.path.exists(gate):
                open(late, "w").close()
        return i * 1_000

    df = spark.range(0, n, numPartitions=parts).select(
        F.udf(gated, "long")("id").alias("t"), (F.col("id") % 4).cast("int").alias("server"),
        (F.col("id") / 1000.0).alias("cpu"))
    src = SparkSource(df, time="t", sort=False, chunk_size=100)
    it = iter(src)
    first = ray.get(next(it).ref)
    assert not os.path.exists(late), "the source waited for the last partition before its first chunk"
    assert src.partitions == 0  # partition 0 is still being handed over
    open(gate, "w").close()
    chunks = [first] + [ray.get(c.ref) for c in it]
    assert not os.path.exists(late) and src.partitions == parts
    ts = np.concatenate([c.data["ts"] for c in chunks])
    assert ts.tolist() == [i * 1_000 for i in range(n)]  # every row, once, in partition order
    assert src.stats["rows"] == n


@pytest.mark.slow
def test_a_failing_spark_job_fails_the_source_loudly(spark):
    from pyspark.sql import functions as F

    from replistream.spark import SparkSourceError

    def bad(i):
        if i == 1_500:
            raise ValueError("unparseable reading 1500")
        return i

    df = spark.range(0, 2_000, numPartitions=4).select(F.udf(bad, "long")("id").alias("t"),
                                                       F.lit(1).alias("server"), F.lit(0.5).alias("cpu"))
    src = SparkSource(df, time="t", sort=False)
    fed = 0
    with pytest.raises(SparkSourceError, match=r"(?s)source '<spark>'.*partition 3 of 4.*unparseable reading 1500"):
        for c in src:
            fed += c.n
    assert fed == 1_500  # partitions 0-2 went through, whole; nothing of partition 3


@pytest.mark.slow
def test_a_spark_job_that_stops_making_progress_fails_the_source_loudly(spark, tmp_path):
    """A Spark task that never ends (its first row waits for a gate, as a stopped executor's task
    would): with no task of the job finishing for ``stall_timeout_s``, the job is cancelled and the
    replay fails naming the partition it waited for, instead of waiting as long as Spark does."""
    import time

    from pyspark.sql import functions as F

    from replistream.spark import SparkSourceError

    gate = str(tmp_path / "gate")

    def stuck(i):
        if i == 0:  # the first row of partition 0
            deadline = time.time() + 60
            while not os.path.exists(gate) and time.time() < deadline:
                time.sleep(0.05)
        return i

    df = spark.range(0, 2_000, numPartitions=4).select(F.udf(stuck, "long")("id").alias("t"),
                                                       F.lit(1).alias("server"), F.lit(0.5).alias("cpu"))
    src = SparkSource(df, time="t", sort=False, stall_timeout_s=2.0)
    fed = 0
    try:
        with pytest.raises(SparkSourceError, match=r"(?s)source '<spark>'.*no progress.*partition 0 of 4.*cancelled"):
            for c in src:
                fed += c.n
    finally:
        open(gate, "w").close()  # (a task the cancel did not interrupt ends now)
    assert fed == 0  # nothing of partition 0 (nor of those after it) was fed


def test_a_stall_or_read_timeout_that_is_not_a_positive_number_is_refused(spark):
    from pyspark.sql import functions as F

    df = spark.range(0, 10).select(F.col("id").alias("t"))
    for bad in (0, -1.0, True, "300"):
        with pytest.raises(ValueError, match="stall_timeout_s must be a number of seconds > 0"):
            SparkSource(df, time="t", stall_timeout_s=bad)
        with pytest.raises(ValueError, match="read_timeout_s must be a number of seconds > 0"):
            SparkSource(df, time="t", read_timeout_s=bad)


@pytest.mark.slow
def test_spark_pipeline_example_matches_spark_sql(spark, tmp_path, repo_root):
    """examples/spark_pipeline.py at small scale, in this process (shared Ray and Spark)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("spark_pipeline", os.path.join(repo_root, "examples",
                                                                                 "spark_pipeline.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    report = mod.main(["--servers", "3", "--duration", "20", "--pace", "10", "--out", str(tmp_path)])
    assert report["exact_match"] and report["lost"] == 0 and report["extra"] == 0
    assert report["alerts_replicated"] == report["alerts_spark_sql"] > 0
    assert report["crash"] is not None and report["crash"]["at_s"] == 10.0
    assert report["crash"]["alerts_before"] < report["alerts_replicated"]  # alerts after the crash time exist
    assert report["readings_after_cleaning"]["loads"] < report["readings_written"]["loads"]


@pytest.mark.slow
def test_readme_spark_snippet_runs(spark, tmp_path, repo_root):
    import re

    readme = open(os.path.join(repo_root, "README.md")).read()
    [snippet] = [c for c in re.findall(r"```python\n(.*?)```", readme, re.S) if "SparkSource" in c]
    cols = readings(300, seed=5, start_us=EPOCH_US)
    (tmp_path / "loads").mkdir()
    pq.write_table(pa.table({"event_time": pa.array(cols["t"], pa.timestamp("us", tz="UTC")),
                             "server": cols["server"], "cpu": cols["cpu"]}), tmp_path / "loads" / "a.parquet")
    # the JVM resolves relative paths against its own working directory, so make them absolute
    snippet = snippet.replace('"loads/"', repr(str(tmp_path / "loads"))).replace(
        '"out/counts"', repr(str(tmp_path / "out" / "counts")))
    exec(compile(snippet, "README.md", "exec"), {"rs": rs})
    back = spark.read.parquet(str(tmp_path / "out" / "counts"))
    assert back.count() > 0 and {"ts", "server", "n"} <= set(back.columns)


def test_a_micro_batch_is_committed_only_once_the_entry_points_have_it(spark, tmp_path):
    """In a deployment the foreachBatch handler returns (and Spark commits the batch) only after the
    feeder ran the batch's Handed sentinel; without it, the handler fails loudly at its deadline."""
    import queue
    import threading

    from replistream.sources import Handed

    (tmp_path / "in").mkdir()
    stream = spark.readStream.schema("t long, server int, cpu double").parquet(str(tmp_path / "in"))
    src = SparkStreamSource(stream, time="t", watermark_delay=0, commit_timeout=1.0)
    src._deployed, src._max_seen = True, None
    src._in_deployment, src._deployed = src._deployed, False
    plan = src._plan()
    batch = spark.createDataFrame([(1, 1, 0.5), (2, 0, 0.7)], "t long, server int, cpu double")
    out: queue.Queue = queue.Queue()
    with pytest.raises(RuntimeError, match="micro-batch 0 did not reach the entry points within commit_timeout=1"):
        src._on_batch(batch, 0, plan, out)  # nobody runs its sentinel
    assert src.handed == []

    out = queue.Queue()
    seen = []

    def feeder():  # takes the items as the feeder does and runs the sentinel once everything before it is fed
        while True:
            item = out.get(timeout=60)
            seen.append(type(item).__name__)
            if isinstance(item, Handed):
                item.apply(None)
                return

    t = threading.Thread(target=feeder)
    t.start()
    later = spark.createDataFrame([(5, 1, 0.5), (6, 0, 0.7)], "t long, server int, cpu double")
    src._on_batch(later, 1, plan, out)
    t.join(60)
    assert src.handed == [1] and seen[-1] == "Handed" and "Punctuation" in seen

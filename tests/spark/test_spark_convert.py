"""Arrow -> source chunks (replistream.spark.convert) and Spark session checks, without starting Spark."""
from __future__ import annotations

import os
import stat

import numpy as np
import pyarrow as pa
import pytest

from replistream.errors import SchemaError
from replistream.operators.entry import EntryLogic, SourceBatch
from replistream.schema import Schema
from replistream.spark.convert import ConversionPlan, convert_table
from replistream.spark.session import SparkUnavailable, java_version
from replistream.spark.source import parse_interval


def plan(schema, kind="int", factor=1, fields=None, on_bad_rows="dead_letter"):
    schema = Schema(schema)
    fields = fields or tuple((f, f) for f in schema.names)
    return ConversionPlan("src", "t", kind, factor, schema, fields, on_bad_rows)


def chunks(table, p, size=10_000):
    return list(convert_table(table, p, size))


def test_clean_rows_convert_exactly_and_chunk_by_position():
    t = pa.table({"t": pa.array(range(10), pa.int64()), "x": pa.array(range(10, 20), pa.int32()),
                  "y": pa.array([i / 4 for i in range(10)], pa.float64())})
    out = chunks(t, plan({"x": "i4", "y": "f8"}, factor=1000), size=4)
    assert [m["n"] for m, _ in out] == [4, 4, 2]
    assert [(m["tmin"], m["tmax"]) for m, _ in out] == [(0, 3000), (4000, 7000), (8000, 9000)]
    data = np.concatenate([sb.data for _, sb in out])
    assert data["ts"].tolist() == [i * 1000 for i in range(10)]
    assert data["x"].tolist() == list(range(10, 20)) and data["y"].tolist() == [i / 4 for i in range(10)]
    assert all(sb.positions is None and not sb.rejected for _, sb in out)


def test_every_kind_of_bad_row_is_rejected_with_a_reason_naming_the_column():
    t = pa.table({
        "t": pa.array([1, None, 3, 4, 5, 6], pa.int64()),
        "small": pa.array([1, 2, 2**40, 4, 5, 6], pa.int64()),
        "f": pa.array([0.5, 1.0, 1.0, None, 1.0, 1.0], pa.float64()),
        "big": pa.array([1, 2, 3, 4, 2**53 + 1, 6], pa.int64()),
        "s": pa.array(["ok", "ok", "ok", "ok", "ok", "far too long"], pa.string()),
    })
    p = plan({"small": "i4", "f": "f8", "big": "f8", "s": "U4"})
    [(meta, sb)] = chunks(t, p)
    assert meta["rejected"] == {"event time 't' is null": 1, "column 'small' is out of range for int32": 1,
                                "column 'f' is null": 1, "column 'big' is not exactly representable as float64": 1,
                                "column 's' is longer than 4 characters": 1}
    assert meta["good"] == 1 and sb.positions.tolist() == [0]
    assert [r[0] for r in sb.rejected] == [1, 2, 3, 4, 5]
    assert sb.rejected[4][2] == {"t": 6, "small": 6, "f": 1.0, "big": 6, "s": "far too long"}
    # the entry point dead-letters them, counts them, and ids follow positions
    e = EntryLogic("src", p.schema)
    out = e.push(sb)
    assert len(out[0]) == 1 and e.malformed_count == 5
    assert sum(d.count for d in e.dead_letters) == 5
    e2 = EntryLogic("src", p.schema)
    assert e2.push(np.concatenate([sb.data]))[0]["id"][0] == out[0]["id"][0]  # first row: position 0 either way


def test_ids_do_not_depend_on_which_rows_were_rejected():
    s = Schema({"x": "i8"})
    t_ok = pa.table({"t": pa.array([1, 2, 3], pa.int64()), "x": pa.array([7, 8, 9], pa.int64())})
    t_bad = pa.table({"t": pa.array([1, None, 3], pa.int64()), "x": pa.array([7, 8, 9], pa.int64())})
    ids = []
    for t in (t_ok, t_bad):
        e = EntryLogic("src", s)
        [(_, sb)] = chunks(t, plan({"x": "i8"}))
        ids.append({int(r["x"]): int(r["id"]) for r in e.push(sb)[0]})
    assert ids[1] == {7: ids[0][7], 9: ids[0][9]}


def test_raise_mode_names_the_column_and_row():
    t = pa.table({"t": pa.array([1, 2], pa.int64()), "x": pa.array([1.0, None], pa.float64())})
    with pytest.raises(SchemaError, match="column 'x' is null.*'x': None"):
        chunks(t, plan({"x": "f8"}, on_bad_rows="raise"))


def test_event_time_kinds():
    ts = pa.array([1_700_000_000_123_456, None], pa.timestamp("us", tz="UTC"))
    [(m, sb)] = chunks(pa.table({"t": ts}), plan({}, kind="timestamp"))
    assert sb.data["ts"].tolist() == [1_700_000_000_123_456] and m["rejected"] == {"event time 't' is null": 1}
    ns = pa.array([1_700_000_000_123_456_789], pa.timestamp("ns"))
    assert chunks(pa.table({"t": ns}), plan({}, kind="timestamp"))[0][1].data["ts"].tolist() == [1_700_000_000_123_456]
    d = pa.array([1, 2], pa.date32())
    assert chunks(pa.table({"t": d}), plan({}, kind="date"))[0][1].data["ts"].tolist() == [86_400_000_000,
                                                                                            172_800_000_000]
    f = pa.array([1.5, float("nan"), float("inf"), 2.25], pa.float64())
    [(m, sb)] = chunks(pa.table({"t": f}), plan({}, kind="float", factor=1_000_000))
    assert sb.data["ts"].tolist() == [1_500_000, 2_250_000]
    assert m["rejected"] == {"event time 't' is not a finite number of microseconds": 2}
    big = pa.array([2**62, 5], pa.int64())
    [(m, sb)] = chunks(pa.table({"t": big}), plan({}, kind="int", factor=1000))
    assert sb.data["ts"].tolist() == [5000] and m["rejected"] == {"event time 't' overflows int64 microseconds": 1}


def test_missing_column_and_wrong_arrow_type_are_errors():
    with pytest.raises(SchemaError, match=r"column\(s\) \['x'\] missing"):
        chunks(pa.table({"t": pa.array([1], pa.int64())}), plan({"x": "i8"}))
    with pytest.raises(SchemaError, match="column 'x' has Arrow type string, expected a number"):
        chunks(pa.table({"t": pa.array([1], pa.int64()), "x": pa.array(["a"])}), plan({"x": "f8"}))


def test_source_batch_checks_its_counts():
    s = Schema({"x": "i8"})
    with pytest.raises(ValueError, match="need their positions"):
        SourceBatch(s.empty(), n=2)
    with pytest.raises(ValueError, match="!= n=3"):
        SourceBatch(s.empty(), n=3, positions=np.zeros(0, np.int64), rejected=[(0, "r", {})])


def test_parse_interval():
    assert parse_interval("10 seconds") == 10_000_000
    assert parse_interval("interval 2 minutes 1 second") == 121_000_000
    assert parse_interval("250 milliseconds") == 250_000
    with pytest.raises(ValueError, match="unknown unit 'fortnights'"):
        parse_interval("1 fortnights")


def _fake_java(tmp_path, text):
    p = tmp_path / "java"
    p.write_text(f"#!/bin/sh\necho '{text}' >&2\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_java_checks_name_the_package_to_install(tmp_path):
    with pytest.raises(SparkUnavailable, match="Java 11.*openjdk-17-jre-headless"):
        java_version(_fake_java(tmp_path, 'openjdk version "11.0.2" 2019-01-15'))
    with pytest.raises(SparkUnavailable, match="Java 8.*openjdk-17"):
        java_version(_fake_java(tmp_path, 'java version "1.8.0_392"'))
    assert java_version(_fake_java(tmp_path, 'openjdk version "21.0.1" 2023-10-17'))[0] == 21
    with pytest.raises(SparkUnavailable, match="no `java` was found.*openjdk-17-jre-headless"):
        java_version(os.path.join(str(tmp_path), "missing", "java"))


class _FakeSpark:
    """What _PartitionStream._wait asks of a SparkContext: the executors alive and a job cancel."""

    def __init__(self, executors):
        self.executors, self.cancelled = executors, []
        tracker = type("T", (), {"getExecutorInfos": lambda _self: [None] * (1 + self.executors)})()
        sc = type("S", (), {"statusTracker": lambda _self: tracker})()
        self._jsc = type("J", (), {"sc": lambda _self: sc})()

    def cancelJobGroup(self, group):
        self.cancelled.append(group)


def _stream(executors, stall_s):
    import threading

    from replistream.spark.source import _PartitionStream

    s = object.__new__(_PartitionStream)
    s.source, s.n, s.stall_s, s.group = "load", 8, stall_s, "g"
    s._done, s._error, s.sc = threading.Event(), [], _FakeSpark(executors)
    s._location, s._progress = (lambda i: None), (lambda: 3)  # nothing cached, no task finishing
    s._PROGRESS_EVERY_S, s._POLL_MAX_S, s._NO_EXECUTOR_S = 0.01, 0.01, 0.1
    return s


def test_a_partition_waited_for_with_no_executor_alive_fails_before_the_stall_deadline():
    # seen with RayDP: its executors killed, Spark says "Lost executor 0" and none is started
    # again; the wait went on for the whole stall_timeout_s (300 s) before
    from replistream.spark.source import SparkSourceError

    s = _stream(executors=0, stall_s=300.0)
    with pytest.raises(SparkSourceError, match=r"no Spark executor has been alive.*partition 2 of 8.*2\.\.7"):
        s._wait(2)
    assert s.sc.cancelled == ["g"]
    # with an executor alive, the same wait ends by the stall deadline, as before
    s = _stream(executors=1, stall_s=0.3)
    with pytest.raises(SparkSourceError, match=r"made no progress"):
        s._wait(2)

"""Schema, batches, timestamps and punctuations (replistream.schema)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from replistream.errors import SchemaError
from replistream.schema import END, Punctuation, Schema, millis, seconds, to_timestamps


@pytest.fixture
def s():
    return Schema({"server": "i8", "cpu": "f8", "host": "U5"})


# -- construction -------------------------------------------------------------

def test_dtype_has_ts_id_then_payload_in_order(s):
    assert s.dtype.names == ("ts", "id", "server", "cpu", "host")
    assert s.dtype.fields["ts"][0] == np.dtype(np.int64)
    assert s.dtype.fields["id"][0] == np.dtype(np.uint64)
    assert s.names == ("server", "cpu", "host")
    assert "cpu" in s and "ts" not in s
    assert s["host"] == np.dtype("U5")


def test_schema_from_pairs_equals_schema_from_mapping():
    assert Schema([("a", "i8"), ("b", "f8")]) == Schema({"a": "i8", "b": "f8"})
    assert Schema([("a", "i8"), ("b", "f8")]) != Schema([("b", "f8"), ("a", "i8")])
    assert Schema(Schema({"a": "i8"})) == Schema({"a": "i8"})


@pytest.mark.parametrize("reserved", ["ts", "id"])
def test_reserved_names_rejected(reserved):
    with pytest.raises(SchemaError, match=f"'{reserved}'.*reserved"):
        Schema({reserved: "i8"})


@pytest.mark.parametrize("fields, word", [
    ([("a", "i8"), ("a", "f8")], "'a'"),
    ({"not an identifier": "i8"}, "not an identifier"),
    ({"x": "not_a_dtype"}, "'x'"),
])
def test_bad_schema_definitions_name_the_field(fields, word):
    with pytest.raises(SchemaError, match=word):
        Schema(fields)


def test_schema_pickles_and_hashes(s):
    t = pickle.loads(pickle.dumps(s))
    assert t == s and hash(t) == hash(s)
    assert t.dtype == s.dtype and t.names == s.names
    b = t.from_records([{"ts": 1, "server": 2, "cpu": 0.5, "host": "h1"}])
    assert b.dtype == s.dtype


def test_schema_with_object_and_bool_fields_pickles():
    s = Schema({"o": "O", "flag": "?", "b": "S4"})
    assert pickle.loads(pickle.dumps(s)) == s


def test_durations_and_punctuation():
    assert seconds(2) == 2_000_000 and seconds(0.5) == 500_000
    assert millis(10) == 10_000
    assert Punctuation(3) < Punctuation(4)
    assert repr(Punctuation(END)) == "Punctuation(END)"
    assert END == np.iinfo(np.int64).max


# -- from_records / from_columns ------------------------------------------------

def test_from_records_converts_values(s):
    b = s.from_records([{"ts": 5, "server": 1, "cpu": 1, "host": "a"},
                        {"ts": 7.0, "server": np.int32(2), "cpu": 0.25, "host": "bcd"}])
    assert b.dtype == s.dtype
    assert b["ts"].tolist() == [5, 7]
    assert b["server"].tolist() == [1, 2]
    assert b["cpu"].tolist() == [1.0, 0.25]
    assert b["host"].tolist() == ["a", "bcd"]
    assert b["id"].tolist() == [0, 0]


def test_from_records_empty_float_only():
    s = Schema({"y": "f8"})
    b = s.from_records([])
    assert len(b) == 0 and b.dtype == s.dtype


def test_from_records_empty(s):
    b = s.from_records([])
    assert len(b) == 0 and b.dtype == s.dtype


def test_from_columns_converts_values_and_ids(s):
    b = s.from_columns({"ts": np.array([3, 1], dtype=np.int32), "server": [1, 2], "cpu": np.array([1, 2], np.int16),
                        "host": np.array(["x", "yy"])}, ids=[10, 11])
    assert b.dtype == s.dtype
    assert b["ts"].tolist() == [3, 1]
    assert b["cpu"].dtype == np.float64 and b["cpu"].tolist() == [1.0, 2.0]
    assert b["id"].tolist() == [10, 11]


def test_from_columns_datetime_ts_is_microseconds():
    s = Schema({"x": "i8"})
    b = s.from_columns({"ts": np.array(["1970-01-01T00:00:01"], dtype="datetime64[s]"), "x": [1]})
    assert b["ts"].tolist() == [1_000_000]


def test_from_columns_ts_from_float_integers():
    assert to_timestamps([1.0, -2.0, 3]).tolist() == [1, -2, 3]
    assert to_timestamps(np.array([1, 2], dtype=np.uint32)).dtype == np.int64


@pytest.mark.parametrize("build", ["records", "columns"])
def test_missing_field_named(s, build):
    with pytest.raises(SchemaError, match="'cpu'"):
        if build == "records":
            s.from_records([{"ts": 1, "server": 1, "host": "a"}], "load")
        else:
            s.from_columns({"ts": [1], "server": [1], "host": ["a"]}, "load")


@pytest.mark.parametrize("build", ["records", "columns"])
def test_missing_ts_named(s, build):
    with pytest.raises(SchemaError, match="'ts'"):
        if build == "records":
            s.from_records([{"server": 1, "cpu": 1.0, "host": "a"}])
        else:
            s.from_columns({"server": [1], "cpu": [1.0], "host": ["a"]})


@pytest.mark.parametrize("bad, field", [
    ({"cpu": "high"}, "cpu"),      # string into float
    ({"server": 1.5}, "server"),   # float into int
    ({"server": "x"}, "server"),
    ({"host": 3}, "host"),         # number into string
    ({"server": 2**70}, "server"),  # out of range
])
def test_wrong_dtype_named(s, bad, field):
    rec = {"ts": 1, "server": 1, "cpu": 1.0, "host": "a"}
    rec.update(bad)
    with pytest.raises(SchemaError, match=f"'{field}'"):
        s.from_records([rec], "load")


def test_int_field_out_of_range_named():
    s = Schema({"small": "i1"})
    with pytest.raises(SchemaError, match="'small'.*range"):
        s.from_columns({"ts": [1], "small": [300]})


def test_error_names_the_stream(s):
    with pytest.raises(SchemaError, match="^load:"):
        s.from_records([{"ts": 1, "server": 1, "cpu": "x", "host": "a"}], "load")


@pytest.mark.parametrize("ts, word", [
    (float("nan"), "nan"),
    (float("inf"), "inf"),
    (1.5, "non-integer"),
    (True, "ts"),
    ("12", "ts"),
    (None, "ts"),
])
def test_bad_timestamps_name_ts(s, ts, word):
    with pytest.raises(SchemaError, match="'ts'") as ei:
        s.from_records([{"ts": ts, "server": 1, "cpu": 1.0, "host": "a"}], "load")
    assert word in str(ei.value)


@pytest.mark.parametrize("col", [
    np.array([1.0, np.nan]),
    np.array([1.0, 2.5]),
    np.array([True, False]),
    np.array(["1", "2"]),
])
def test_bad_timestamp_columns(col):
    with pytest.raises(SchemaError, match="'ts'"):
        Schema({"x": "i8"}).from_columns({"ts": col, "x": [1, 2]})


def test_bool_mixed_into_int_timestamps_rejected():
    with pytest.raises(SchemaError, match="'ts'"):
        to_timestamps(np.array([1, True], dtype=object))


def test_nonint_ts_error_names_row():
    with pytest.raises(SchemaError, match="row 2"):
        to_timestamps([1.0, 2.0, 2.5])


def test_string_too_long_named(s):
    with pytest.raises(SchemaError, match="'host'.*longer"):
        s.from_records([{"ts": 1, "server": 1, "cpu": 1.0, "host": "abcdef"}])


def test_string_of_exact_width_accepted(s):
    assert s.from_records([{"ts": 1, "server": 1, "cpu": 1.0, "host": "abcde"}])["host"][0] == "abcde"


def test_bytes_too_long_named():
    s = Schema({"tag": "S3"})
    with pytest.raises(SchemaError, match="'tag'.*longer"):
        s.from_columns({"ts": [1], "tag": [b"abcd"]})
    assert s.from_columns({"ts": [1], "tag": [b"abc"]})["tag"].tolist() == [b"abc"]


def test_short_str_into_bytes_field_accepted():
    s = Schema({"tag": "S3"})
    assert s.from_columns({"ts": [1], "tag": ["ab"]})["tag"].tolist() == [b"ab"]


@pytest.mark.parametrize("build", ["records", "columns"])
def test_undeclared_field_named(s, build):
    with pytest.raises(SchemaError, match="'?extra'?"):
        if build == "records":
            s.from_records([{"ts": 1, "server": 1, "cpu": 1.0, "host": "a", "extra": 0}])
        else:
            s.from_columns({"ts": [1], "server": [1], "cpu": [1.0], "host": ["a"], "extra": [0]})


def test_record_setting_id_rejected(s):
    with pytest.raises(SchemaError, match="'id'"):
        s.from_records([{"ts": 1, "id": 5, "server": 1, "cpu": 1.0, "host": "a"}])


def test_record_not_a_mapping(s):
    with pytest.raises(SchemaError, match="record 0"):
        s.from_records([(1, 1, 1.0, "a")])


def test_column_length_mismatch_named(s):
    with pytest.raises(SchemaError, match="'cpu'"):
        s.from_columns({"ts": [1, 2], "server": [1, 2], "cpu": [1.0], "host": ["a", "b"]})


# -- check ----------------------------------------------------------------------

def test_check_returns_exact_batch_unchanged(s):
    b = s.empty(3)
    assert s.check(b) is b


def test_check_reorders_fields(s):
    dt = [("cpu", "f8"), ("host", "U5"), ("id", "u8"), ("server", "i8"), ("ts", "i8")]
    raw = np.zeros(2, dtype=dt)
    raw["cpu"] = [0.5, 1.5]
    raw["host"] = ["a", "b"]
    raw["id"] = [7, 8]
    raw["server"] = [3, 4]
    raw["ts"] = [10, 20]
    b = s.check(raw, "x")
    assert b.dtype == s.dtype
    assert b.tolist() == [(10, 7, 3, 0.5, "a"), (20, 8, 4, 1.5, "b")]


def test_check_errors_name_field(s):
    good = s.empty(1)
    missing = np.zeros(1, dtype=[("ts", "i8"), ("id", "u8"), ("server", "i8"), ("host", "U5")])
    with pytest.raises(SchemaError, match="missing field 'cpu'"):
        s.check(missing, "load")
    wrong = np.zeros(1, dtype=[("ts", "i8"), ("id", "u8"), ("server", "i8"), ("cpu", "f4"), ("host", "U5")])
    with pytest.raises(SchemaError, match="'cpu'.*float32"):
        s.check(wrong, "load")
    wrong_ts = np.zeros(1, dtype=[("ts", "f8"), ("id", "u8"), ("server", "i8"), ("cpu", "f8"), ("host", "U5")])
    with pytest.raises(SchemaError, match="'ts'"):
        s.check(wrong_ts, "load")
    extra = np.zeros(1, dtype=s.dtype.descr + [("z", "i8")])
    with pytest.raises(SchemaError, match="'z'"):
        s.check(extra, "load")
    with pytest.raises(SchemaError, match="structured"):
        s.check([good], "load")
    with pytest.raises(SchemaError, match="one-dimensional"):
        s.check(s.empty(4).reshape(2, 2), "load")

"""A replica lost while it wrote a ParquetSink file leaves its hidden temp file in the folder (it
never links or removes it): the Ray engine removes those of lost replicas when it assembles the
run's result (``ParquetSink.remove_temp_files``); nothing else in the folder is touched. A
clean-clone run found one left by ``pos.1#0``, killed mid-write, in
``tests/ray/test_app_partitions_ray.py``."""
from __future__ import annotations

import os

from replistream import ParquetSink


def test_only_the_lost_replicas_hidden_temp_files_are_removed(tmp_path):
    sink = ParquetSink(str(tmp_path / "pos"))
    os.makedirs(sink.path)
    names = [".pos.1-0-part-0000000000000-p0001.parquet.tmp",  # the lost replica's, half written
             ".pos.1-1-part-0000000000000-p0001.parquet.tmp",  # a live peer's, being written
             ".pos.1-0-_SUCCESS-p0001.tmp",                     # the lost replica's marker
             "part-0000000000000-p0001.parquet", ".pos.1-0-notes.txt", "notes.tmp"]
    for n in names:
        open(os.path.join(sink.path, n), "w").close()
    gone = sink.remove_temp_files(["pos.1#0"])
    assert gone == [".pos.1-0-_SUCCESS-p0001.tmp", ".pos.1-0-part-0000000000000-p0001.parquet.tmp"]
    assert sorted(os.listdir(sink.path)) == sorted(set(names) - set(gone))
    assert sink.remove_temp_files([]) == [] and sink.remove_temp_files(["pos.1#0"]) == []

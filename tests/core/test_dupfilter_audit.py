"""The duplicate filter's audit (REPLISTREAM_AUDIT=1, replistream/operators/dupfilter.py): a tuple
that Algorithm 1's line 2 drops as a copy (``ts <= max punctuation``) although the filter never
passed it is counted as a loss, with its channel, timestamp and id; a real copy is not, and a
restored filter does not count what lies at or below the punctuation it was restored at."""
from __future__ import annotations

import pytest

from replistream.operators.dupfilter import DuplicateFilter, FilterState
from replistream.schema import Schema

S = Schema({"x": "i8"})


def batch(ts, ids):
    return S.from_columns({"ts": ts, "x": [0] * len(ts)}, ids=ids)


@pytest.fixture
def audit(monkeypatch):
    monkeypatch.setenv("REPLISTREAM_AUDIT", "1")


def test_a_punctuation_ahead_of_its_tuples_is_a_loss_and_named(audit):
    f = DuplicateFilter(2, S)
    f.on_batch(0, batch([1, 2], [11, 12]))
    # channel 1 promises everything up to 10, but never carried ids 13 and 14 (ts 5, 6)
    assert f.on_punctuation(1, 10)
    assert f.on_batch(0, batch([2, 5, 6], [12, 13, 14])) == []  # 12: a copy; 13, 14: lost
    assert f.unseen_drops == 2
    assert f.unseen_sample == [(0, 5, 13), (0, 6, 14)]
    assert f.stats()["unseen_drops"] == 2


def test_real_copies_are_not_counted(audit):
    f = DuplicateFilter(2, S)
    f.on_batch(0, batch([1, 2, 3], [11, 12, 13]))
    f.on_punctuation(0, 3)
    assert f.on_batch(1, batch([1, 2, 3], [11, 12, 13])) == []  # the slower replica's copies
    assert f.unseen_drops == 0 and f.duplicates == 3


def test_a_restored_filter_counts_only_above_its_restore_point(audit):
    f = DuplicateFilter(2, S).restore(FilterState(10, [12], [7]))
    f.on_punctuation(0, 20)
    f.on_batch(1, batch([4, 12, 15], [5, 7, 8]))  # 5: passed by the checkpoint's replica; 7: passed; 8: lost
    assert f.unseen_drops == 1 and f.unseen_sample == [(1, 15, 8)]


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("REPLISTREAM_AUDIT", raising=False)
    f = DuplicateFilter(2, S)
    f.on_punctuation(1, 10)
    f.on_batch(0, batch([5], [13]))
    assert f.audit is None and "unseen_drops" not in f.stats() and f.duplicates == 1

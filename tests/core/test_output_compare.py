"""assert_same_output: the multiset comparison every exactness check rests on."""
import numpy as np
import pytest

from replistream.testing import _same_multiset, assert_same_output

DT = [("ts", "i8"), ("id", "u8"), ("v", "f8"), ("k", "i4")]  # 28 bytes: not a multiple of 8


def _rows(n, seed=0):
    rng = np.random.default_rng(seed)
    x = np.zeros(n, dtype=DT)
    x["ts"], x["id"], x["k"] = rng.integers(0, 50, n), rng.integers(0, 50, n), rng.integers(0, 3, n)
    x["v"] = rng.integers(0, 4, n) / 4
    return x  # small ranges: many equal rows


@pytest.mark.parametrize("seed", range(5))
def test_a_permutation_is_the_same_multiset_and_any_change_is_not(seed):
    x = _rows(2000, seed)
    rng = np.random.default_rng(seed + 100)
    y = x[rng.permutation(len(x))]
    assert _same_multiset(x, y)
    assert_same_output(x, y)
    for field in ("ts", "v", "k"):
        z = y.copy()
        z[7][field] += 1
        assert not _same_multiset(x, z)
    assert not _same_multiset(x, np.concatenate([y[:-1], y[:1]]))  # one lost, one duplicated


def test_a_difference_names_what_is_lost_extra_and_duplicated():
    x = _rows(500)
    y = np.concatenate([x[1:], x[2:3]])  # row 0 lost, row 2 twice
    with pytest.raises(AssertionError, match=r"1 lost, 1 extra \(1 of them duplicates\)"):
        assert_same_output(x, y)
    with pytest.raises(AssertionError, match="same tuples, different order"):
        assert_same_output(x, x[::-1].copy(), ordered=True)

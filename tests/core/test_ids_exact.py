"""Deterministic ids (replistream.ids) and exact, order-independent float sums (replistream.exact)."""
from __future__ import annotations

import hashlib
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replistream.exact as exact
from replistream.exact import ExactSums, exact_row_sums
from replistream.ids import fmix, hash_columns, mix, stable_hash

PROPS = settings(max_examples=80, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# -- ids ------------------------------------------------------------------------

def py_fmix(z: int) -> int:
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def py_mix(*parts: int) -> int:
    h = py_fmix(parts[0] + GOLDEN)
    for p in parts[1:]:
        h = py_fmix(h ^ ((p + GOLDEN) & M64))
    return h


u64 = st.integers(0, M64)


@PROPS
@given(st.lists(u64, min_size=1, max_size=4))
def test_mix_matches_splitmix_reference(parts):
    got = mix(*[np.uint64(p) for p in parts])
    assert int(got) == py_mix(*parts)
    assert int(mix(*[np.uint64(p) for p in parts])) == int(got)  # deterministic


def test_fmix_reference_values():
    with np.errstate(over="ignore"):
        assert int(fmix(np.uint64(0))) == 0
        for z in (1, 2, 12345, M64):
            assert int(fmix(np.uint64(z))) == py_fmix(z)
        arr = np.array([1, 2, 12345, M64], dtype=np.uint64)
        assert fmix(arr).tolist() == [py_fmix(int(z)) for z in arr.tolist()]


def test_mix_is_order_sensitive_and_vectorised():
    a, b = np.uint64(1), np.uint64(2)
    assert int(mix(a, b)) != int(mix(b, a))
    assert int(mix(a)) != int(mix(a, np.uint64(0)))
    v = mix(np.uint64(3), np.arange(5, dtype=np.uint64))
    assert v.dtype == np.uint64 and v.shape == (5,)
    assert len(set(v.tolist())) == 5
    assert [int(mix(np.uint64(3), np.uint64(i))) for i in range(5)] == v.tolist()


def test_stable_hash_is_blake2b_and_process_independent():
    for text in ("load", "source:load", "", "ünïcode"):
        want = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
        assert int(stable_hash(text)) == want
    assert stable_hash("a") != stable_hash("b")


def _one_col(values, dtype):
    b = np.zeros(len(values), dtype=[("v", dtype)])
    b["v"] = values
    return b


def test_hash_columns_negative_zero_equals_zero():
    h = hash_columns(_one_col([0.0, -0.0], "f8"), ("v",))
    assert h[0] == h[1]
    h32 = hash_columns(_one_col([-0.0], "f4"), ("v",))
    assert h32[0] == h[0]


def test_hash_columns_all_nans_agree():
    nans = np.array([np.nan, -np.nan, np.float64(np.nan) * -1], dtype=np.float64)
    payload = np.array([0x7FF8000000000123], dtype=np.uint64).view(np.float64)
    vals = np.concatenate([nans, payload])
    assert np.isnan(vals).all()
    assert len({v.tobytes() for v in vals}) > 1  # genuinely different bit patterns
    h = hash_columns(_one_col(vals, "f8"), ("v",))
    assert len(set(h.tolist())) == 1
    assert h[0] != hash_columns(_one_col([1.0], "f8"), ("v",))[0]


def test_hash_columns_strings_and_bytes():
    h = hash_columns(_one_col(["ab", "ab", "ba", "", "abc"], "U3"), ("v",))
    assert h[0] == h[1]
    assert len({h[0], h[2], h[3], h[4]}) == 4
    hb = hash_columns(_one_col([b"ab", b"ab", b"ba"], "S4"), ("v",))
    assert hb[0] == hb[1] != hb[2]


def test_hash_columns_string_independent_of_declared_width():
    a = hash_columns(_one_col(["xy"], "U2"), ("v",))
    b = hash_columns(_one_col(["xy"], "U6"), ("v",))
    assert a[0] == b[0]


def test_hash_columns_numbers_by_value_and_rowwise():
    a = hash_columns(_one_col([1, 2, 3], "i4"), ("v",))
    b = hash_columns(_one_col([1, 2, 3], "i8"), ("v",))
    assert a.tolist() == b.tolist()
    assert len(set(a.tolist())) == 3
    # each row's hash depends only on that row
    c = hash_columns(_one_col([3, 1], "i8"), ("v",))
    assert c.tolist() == [b[2], b[0]]
    f32 = hash_columns(_one_col([0.5, 1.5], "f4"), ("v",))
    f64 = hash_columns(_one_col([0.5, 1.5], "f8"), ("v",))
    assert f32.tolist() == f64.tolist()


def test_hash_columns_multi_field_order_matters():
    b = np.array([(1, 2), (2, 1)], dtype=[("a", "i8"), ("b", "i8")])
    ab = hash_columns(b, ("a", "b"))
    ba = hash_columns(b, ("b", "a"))
    assert ab[0] != ab[1]
    assert ab[0] == ba[1] and ab[1] == ba[0]
    assert ab[0] != hash_columns(b, ("a",))[0]


def test_hash_columns_objects_by_repr():
    b = np.zeros(3, dtype=[("o", "O")])
    b["o"] = [(1, 2), (1, 2), "x"]
    h = hash_columns(b, ("o",))
    assert h[0] == h[1] != h[2]


# -- exact sums -------------------------------------------------------------------

def exact_reference(values) -> float:
    """Correctly rounded sum with IEEE rules for inf/nan (via exact rationals)."""
    vals = [float(v) for v in values]
    if any(math.isnan(v) for v in vals):
        return math.nan
    pinf, ninf = math.inf in vals, -math.inf in vals
    if pinf and ninf:
        return math.nan
    if pinf or ninf:
        return math.inf if pinf else -math.inf
    total = sum((Fraction(v) for v in vals), Fraction(0))
    try:
        return float(total)
    except OverflowError:
        return math.inf if total > 0 else -math.inf


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


floats_wide = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e-300, max_value=1e-300),                 # tiny and subnormal
    st.floats(min_value=1e300, max_value=1.7976931348623157e308),   # huge
    st.floats(min_value=-1e6, max_value=1e6),
    st.sampled_from([1e16, -1e16, 1.0, 0.1, 5e-324, -5e-324, 2.0**-1074, 2.0**1023, -0.0]),
)
floats_special = st.one_of(floats_wide, st.sampled_from([math.inf, -math.inf, math.nan]))


def run_sums(values, rows, n_rows, cuts):
    acc = ExactSums(1)
    acc.grow(n_rows)
    vals = np.asarray(values, dtype=np.float64)
    rws = np.asarray(rows, dtype=np.int64)
    bounds = [0] + sorted(cuts) + [len(vals)]
    for a, b in zip(bounds[:-1], bounds[1:]):
        acc.add(rws[a:b], vals[a:b])
    return acc.result(np.arange(n_rows))


@PROPS
@given(st.lists(floats_wide, max_size=40), st.randoms(use_true_random=False))
def test_exact_sum_equals_fsum_any_order_and_batching(values, rnd):
    want = exact_reference(values)
    try:
        fs = math.fsum(values)
    except OverflowError:  # fsum can overflow on an intermediate partial; the exact reference cannot
        fs = None
    if fs is not None:
        assert want == fs
    base = run_sums(values, [0] * len(values), 1, [])[0]
    assert same(base, want)
    for _ in range(3):
        perm = list(values)
        rnd.shuffle(perm)
        cuts = rnd.sample(range(len(perm) + 1), min(len(perm) + 1, rnd.randint(0, 4)))
        got = run_sums(perm, [0] * len(perm), 1, cuts)[0]
        assert np.float64(got).tobytes() == np.float64(base).tobytes()


@PROPS
@given(st.lists(floats_special, max_size=30), st.randoms(use_true_random=False))
def test_exact_sum_special_values_any_order(values, rnd):
    want = exact_reference(values)
    base = run_sums(values, [0] * len(values), 1, [])[0]
    assert same(base, want)
    perm = list(values)
    rnd.shuffle(perm)
    cuts = rnd.sample(range(len(perm) + 1), min(len(perm) + 1, 2))
    got = run_sums(perm, [0] * len(perm), 1, cuts)[0]
    assert same(got, base)
    if not math.isnan(base):
        assert np.float64(got).tobytes() == np.float64(base).tobytes()


@PROPS
@given(st.lists(st.tuples(st.integers(0, 4), floats_wide), max_size=60), st.randoms(use_true_random=False))
def test_exact_sums_many_rows(pairs, rnd):
    rows = [r for r, _ in pairs]
    values = [v for _, v in pairs]
    want = [exact_reference([v for r, v in pairs if r == i]) for i in range(5)]
    got = run_sums(values, rows, 5, [])
    assert all(same(g, w) for g, w in zip(got.tolist(), want))
    order = list(range(len(pairs)))
    rnd.shuffle(order)
    cuts = rnd.sample(range(len(order) + 1), min(len(order) + 1, 3))
    got2 = run_sums([values[i] for i in order], [rows[i] for i in order], 5, cuts)
    assert got2.tobytes() == got.tobytes()


def test_exact_sums_docstring_cases():
    acc = ExactSums(2)
    acc.add(np.array([0, 1, 0]), np.array([0.1, 2.0, 0.2]))
    assert acc.result(np.array([0, 1])).tolist() == [math.fsum([0.1, 0.2]), 2.0]
    acc.add(np.zeros(3, dtype=np.int64), np.array([1e16, 1.0, -1e16]))
    assert acc.result(np.array([0]))[0] == math.fsum([0.1, 0.2, 1e16, 1.0, -1e16])
    acc.clear(np.array([0]))
    assert acc.result(np.array([0, 1])).tolist() == [0.0, 2.0]


def test_exact_sums_overflow_rounds_to_inf():
    acc = ExactSums(2)
    big = np.finfo(np.float64).max
    acc.add(np.array([0, 0, 1, 1]), np.array([big, big, -big, -big]))
    assert acc.result(np.array([0, 1])).tolist() == [math.inf, -math.inf]
    acc.add(np.array([0]), np.array([-big]))  # back in range: exact, not sticky inf
    assert acc.result(np.array([0]))[0] == big


def test_exact_sums_add_rows_merges_tables():
    a, b = ExactSums(2), ExactSums(3)
    a.add(np.array([0, 1]), np.array([1e16, 0.5]))
    b.add(np.array([2, 2, 0]), np.array([1.0, -1e16, math.inf]))
    a.add_rows(np.array([0, 1]), b, np.array([2, 0]))
    assert a.result(np.array([0, 1])).tolist() == [math.fsum([1e16, 1.0, -1e16]), math.inf]


def test_exact_row_sums():
    rng = np.random.default_rng(7)
    v = rng.normal(size=(6, 9)) * 10.0 ** rng.integers(-10, 15, size=(6, 9))
    got = exact_row_sums(v)
    assert got.tolist() == [math.fsum(r) for r in v.tolist()]
    assert exact_row_sums(v[:, ::-1]).tobytes() == got.tobytes()


@PROPS
@given(st.lists(st.tuples(st.integers(0, 2), floats_wide), min_size=1, max_size=40))
def test_renormalise_keeps_results(pairs):
    rows = np.array([r for r, _ in pairs], dtype=np.int64)
    vals = np.array([v for _, v in pairs], dtype=np.float64)
    acc = ExactSums(3)
    acc.add(rows, vals)
    before = acc.result(np.arange(3))
    acc._renormalise(np.arange(3))
    after = acc.result(np.arange(3))
    assert after.tobytes() == before.tobytes()
    lim = acc.limbs[:, :-1]
    assert (lim >= 0).all() and (lim < (1 << 32)).all()  # every limb but the top one is a 32-bit digit
    assert (acc.adds[:3] == 1).all()
    # and adding more after renormalising still gives the exact sum
    acc.add(rows, vals)
    want = [exact_reference(list(vals[rows == i]) * 2) for i in range(3)]
    assert all(same(g, w) for g, w in zip(acc.result(np.arange(3)).tolist(), want))


def test_renormalise_triggered_by_add(monkeypatch):
    monkeypatch.setattr(exact, "_RENORMALISE_AFTER", 3)
    rng = random.Random(11)
    values = [rng.choice([-1, 1]) * rng.random() * 10.0 ** rng.randint(-300, 300) for _ in range(200)]
    acc = ExactSums(1)
    calls = []
    orig = acc._renormalise

    def spy(rows):
        calls.append(len(rows))
        orig(rows)

    acc._renormalise = spy
    for i in range(0, 200, 2):
        acc.add(np.zeros(2, dtype=np.int64), np.array(values[i:i + 2]))
    assert calls, "the renormalisation path was not exercised"
    assert acc.result(np.array([0]))[0] == exact_reference(values)


@pytest.mark.parametrize("seed", range(8))
def test_argsort_u64_is_numpys_stable_argsort(seed):
    """The radix-first sort the duplicate filters, the joins and the aggregates' indexes use gives
    numpy's stable order exactly: spread, repeated, narrow-range and sorted keys, any length."""
    from replistream.ids import argsort_u64

    rng = np.random.default_rng(seed)
    for n in (0, 1, 255, 256, 257, 5000):
        for keys in (rng.integers(0, 2**64 - 1, n, dtype=np.uint64), rng.integers(0, 7, n).astype(np.uint64),
                     np.uint64(2**60) + rng.integers(0, 2**20, n).astype(np.uint64),
                     np.sort(rng.integers(0, 2**64 - 1, n, dtype=np.uint64))):
            assert argsort_u64(keys).tolist() == np.argsort(keys, kind="stable").tolist()

"""Order-independent, exact summation of float64 values (a vectorised superaccumulator).

Replica consistency (Hwang §III, Definition 2) needs every replica to produce
*bit-identical* outputs from the same multiset of inputs, whatever order and
batching it saw them in. Floating-point addition is not associative, so a
running ``float`` sum differs between replicas that saw different batches.
Here every finite float64 is split into exact integer pieces in a fixed-point
grid of 32-bit limbs covering the whole float64 range; limbs add as int64,
which is associative, and the total is rounded once, correctly, at the end
(CPython's ``int / int`` is correctly rounded). The result equals
``math.fsum`` of the values, in any order.

>>> import math, numpy as np
>>> acc = ExactSums(1)
>>> acc.add(np.zeros(3, dtype=np.int64), np.array([1e16, 1.0, -1e16]))
>>> bool(acc.result(np.array([0]))[0] == math.fsum([1e16, 1.0, -1e16]))
True
"""
from __future__ import annotations

import math

import numpy as np

_BITS = 32
_MASK = np.int64((1 << _BITS) - 1)
_SHIFT = 1126  # x == mantissa_int * 2**(exp - 53); exp - 53 >= -1126 for every float64
LIMBS = 70  # ceil((2097 + 53) / 32) + 2 spare limbs for growth
_RENORMALISE_AFTER = 1 << 28  # each add contributes < 2**33 per limb; int64 holds 2**30 of them


def _limb_parts(values: np.ndarray):
    """Split finite float64 values into (limb index, int64 contribution) triples."""
    m, e = np.frexp(values)
    mi = (m * float(1 << 53)).astype(np.int64)  # exact: |mi| < 2**53
    sign = np.where(mi < 0, -1, 1).astype(np.int64)
    mi = np.abs(mi)
    pos = (e.astype(np.int64) - 53 + _SHIFT)
    limb = pos >> 5
    sh = pos & 31
    lo = mi & _MASK
    hi = mi >> _BITS
    bb = lo << sh  # < 2**63
    aa = hi << sh  # < 2**52
    c0 = (bb & _MASK) * sign
    c1 = ((bb >> _BITS) + (aa & _MASK)) * sign
    c2 = (aa >> _BITS) * sign
    return limb, c0, c1, c2


class ExactSums:
    """A growable table of exact float sums, one per row.

    ``add(rows, values)`` adds each value to its row (rows may repeat);
    ``result(rows)`` returns the correctly rounded sums; ``clear(rows)``
    resets rows for reuse. Infinities and NaN follow IEEE rules
    (``inf + -inf`` is NaN).

    >>> s = ExactSums(2)
    >>> s.add(np.array([0, 1, 0]), np.array([0.1, 2.0, 0.2]))
    >>> s.result(np.array([0, 1])).tolist()
    [0.30000000000000004, 2.0]
    """

    def __init__(self, capacity: int = 16):
        self.limbs = np.zeros((capacity, LIMBS), dtype=np.int64)
        self.special = np.zeros((capacity, 3), dtype=np.int64)  # counts of nan, +inf, -inf
        self.adds = np.zeros(capacity, dtype=np.int64)

    def grow(self, capacity: int) -> None:
        old = len(self.limbs)
        if capacity <= old:
            return
        for name in ("limbs", "special", "adds"):
            arr = getattr(self, name)
            new = np.zeros((capacity,) + arr.shape[1:], dtype=arr.dtype)
            new[:old] = arr
            setattr(self, name, new)

    def add(self, rows: np.ndarray, values: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if not len(rows):
            return
        finite = np.isfinite(values)
        if not finite.all():
            bad = ~finite
            v, r = values[bad], rows[bad]
            col = np.where(np.isnan(v), 0, np.where(v > 0, 1, 2))
            np.add.at(self.special, (r, col), 1)
            rows, values = rows[finite], values[finite]
            if not len(rows):
                return
        uniq, local = np.unique(rows, return_inverse=True)
        limb, c0, c1, c2 = _limb_parts(values)
        n = len(uniq)
        base = local * LIMBS + limb
        idx = np.concatenate([base, base + 1, base + 2])
        w = np.concatenate([c0, c1, c2]).astype(np.float64)
        # Per-cell sums stay below 2**53 for batches under 2**20 values: exact in float64.
        if len(values) >= (1 << 20):
            half = len(rows) // 2
            self.add(rows[:half], values[:half])
            self.add(rows[half:], values[half:])
            return
        table = np.bincount(idx, weights=w, minlength=n * LIMBS).reshape(n, LIMBS)
        self.limbs[uniq] += table.astype(np.int64)
        self.adds[uniq] += np.bincount(local, minlength=n)
        over = uniq[self.adds[uniq] > _RENORMALISE_AFTER]
        if len(over):
            self._renormalise(over)

    def add_rows(self, rows: np.ndarray, other: "ExactSums", other_rows: np.ndarray) -> None:
        """Add the sums held in ``other[other_rows]`` into ``self[rows]`` (rows unique)."""
        self.limbs[rows] += other.limbs[other_rows]
        self.special[rows] += other.special[other_rows]
        self.adds[rows] += other.adds[other_rows]

    def _renormalise(self, rows: np.ndarray) -> None:
        acc = self.limbs[rows]
        for j in range(LIMBS - 1):
            carry = acc[:, j] >> _BITS  # arithmetic shift: floor division by 2**32
            acc[:, j] -= carry << _BITS
            acc[:, j + 1] += carry
        self.limbs[rows] = acc
        self.adds[rows] = 1

    def result(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty(len(rows), dtype=np.float64)
        for i, r in enumerate(np.asarray(rows, dtype=np.int64).tolist()):
            nan, pinf, ninf = self.special[r].tolist()
            if nan or (pinf and ninf):
                out[i] = math.nan
                continue
            if pinf or ninf:
                out[i] = math.inf if pinf else -math.inf
                continue
            total = 0
            for j, v in enumerate(self.limbs[r].tolist()):
                if v:
                    total += v << (_BITS * j)
            try:
                out[i] = total / (1 << _SHIFT)
            except OverflowError:
                out[i] = math.inf if total > 0 else -math.inf
        return out

    def clear(self, rows: np.ndarray) -> None:
        self.limbs[rows] = 0
        self.special[rows] = 0
        self.adds[rows] = 0


def exact_row_sums(values: np.ndarray) -> np.ndarray:
    """Correctly rounded sum of each row of a 2-D float array (order-independent).

    >>> exact_row_sums(np.array([[0.1, 0.2, 0.3], [1e16, 1.0, -1e16]])).tolist()
    [0.6, 1.0]
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[0]
    acc = ExactSums(max(n, 1))
    acc.add(np.repeat(np.arange(n), values.shape[1]), values.reshape(-1))
    return acc.result(np.arange(n))

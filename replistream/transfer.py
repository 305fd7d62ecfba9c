"""Transfer strategies: how a checkpoint moves from a live peer to a new replica (Megaphone §3.3).

A *plan* is the list of bin sets moved in successive steps; each step is
taken by the sending replica at one of its punctuations (a logical time) and
installed by the receiver (:class:`~replistream.engine.StagedReplica`), while
the sender keeps processing between steps.

* ``"all-at-once"``: one step with every bin (the largest pause of the sender,
  the shortest transfer);
* ``"batched"``: ``bins_per_step`` bins per step;
* ``"fluid"``: one bin per step (the smallest pauses, the longest transfer).

State that does not partition by key (:func:`~replistream.engine.splittable`
is False: an unkeyed join, a logic behind a Sorter) always moves at once.

>>> [len(s) for s in plan_transfer("batched", bits=3, bins_per_step=3)]
[3, 3, 2]
>>> len(plan_transfer("fluid", bits=4)), len(plan_transfer("all-at-once", bits=4))
(16, 1)
"""
from __future__ import annotations

import numpy as np

#: The strategies of Megaphone §3.3 (and §5.3's comparison).
STRATEGIES = ("all-at-once", "batched", "fluid")


def plan_transfer(strategy: str, bits: int, bins_per_step: int | None = None,
                  splittable: bool = True) -> list[np.ndarray]:
    """The bins of each step of a transfer of ``2**bits`` bins with ``strategy``.

    ``bins_per_step`` is for ``"batched"`` (default: 16 steps). With
    ``splittable=False`` every strategy is one step.

    >>> plan_transfer("fluid", bits=2, splittable=False)[0].tolist()
    [0, 1, 2, 3]
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown transfer strategy {strategy!r}; choose one of {STRATEGIES}")
    if not 0 <= int(bits) <= 16:
        raise ValueError(f"bits must be in 0..16, got {bits}")
    nb = 1 << int(bits)
    every = np.arange(nb, dtype=np.int64)
    if strategy == "all-at-once" or not splittable:
        return [every]
    if strategy == "fluid":
        n = 1
    else:
        n = max(1, nb // 16) if bins_per_step is None else int(bins_per_step)
        if n < 1:
            raise ValueError(f"bins_per_step must be >= 1, got {bins_per_step}")
    return [every[i:i + n] for i in range(0, nb, n)]

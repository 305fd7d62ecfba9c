"""Baselines with the same interface as :func:`~replistream.placement.mincost.min_cost`.

* :func:`random_placement`: every replica of every node on a seeded random
  server (the paper's comparison in Fig. 4, "replicated each operator at k
  random places"); replicas of one node on distinct servers. With ``alpha``
  and/or ``d_min`` given, the random choice is among the servers that pass
  Algorithm 5's constraints, so the two can be compared under equal rules.
* :func:`non_replicated`: one replica per node by spring relaxation
  (:func:`~replistream.placement.spring.spring_relaxation`), the placement the
  paper starts from and measures relative bandwidth and cost against.

>>> from replistream.placement.model import PlacementProblem
>>> p = PlacementProblem(list("abcd"), np.ones((4, 4)) - np.eye(4), [("s", "o", 1.0)], fixed={"s": "a"})
>>> random_placement(p, k=2, seed=1).replicas == random_placement(p, k=2, seed=1).replicas
True
>>> non_replicated(p).replicas
{'o': ['a']}
"""
from __future__ import annotations

import numpy as np

from .mincost import Placer, check_k
from .model import PlacementError, PlacementProblem
from .result import Placement

__all__ = ["random_placement", "non_replicated"]


def random_placement(problem: PlacementProblem, k: int, seed: int = 0, alpha: float | None = None,
                     d_min: float | None = None, explain: int = 0) -> Placement:
    """``k`` replicas of every node on random distinct servers (seeded; numpy ``default_rng``).

    Placed phase by phase in the same node order as Algorithm 5; each pick is
    uniform over the servers that do not hold a replica of the node yet (and,
    when ``alpha``/``d_min`` are given, pass the load / distance tests).

    >>> from replistream.placement.model import PlacementProblem
    >>> p = PlacementProblem(list("abc"), np.zeros((3, 3)), [("s", "o", 1.0)], fixed={"s": "a"})
    >>> sorted(random_placement(p, k=3, seed=5).replicas["o"])
    ['a', 'b', 'c']
    """
    k = check_k(problem, k)
    rng = np.random.default_rng(seed)
    constrained = alpha is not None or d_min is not None
    placer = Placer(problem, alpha=np.inf if alpha is None else alpha, d_min=0.0 if d_min is None else d_min,
                    explain=explain)
    for phase in range(1, k + 1):
        for node in problem.nodes:
            if phase > 1 and node in problem.single:
                continue
            holds, load_ok, dmin_ok = placer.constraints(node)
            ok = ~holds & (load_ok & dmin_ok if constrained else True)
            cand = np.flatnonzero(ok)
            if cand.size == 0:
                raise PlacementError(placer._infeasible(node, len(placer.where.get(node, [])), holds, load_ok, dmin_ok))
            s = int(cand[rng.integers(cand.size)])
            placer.add(node, s, phase, "random")
    params = {"k": k, "seed": seed, "alpha": alpha, "d_min": d_min}
    return placer.placement("random", params)


def non_replicated(problem: PlacementProblem, k: int = 1, **spring) -> Placement:
    """The minimum-cost placement without replication (spring relaxation); ``k`` must be 1.

    >>> from replistream.placement.model import PlacementProblem
    >>> p = PlacementProblem(["a", "b"], np.zeros((2, 2)), [("s", "o", 1.0)], fixed={"s": "a"})
    >>> non_replicated(p, k=2)
    Traceback (most recent call last):
    ...
    ValueError: the non-replicated strategy places one replica per node; k=2 given (use 'min-cost' or 'random')
    """
    if k != 1:
        raise ValueError(f"the non-replicated strategy places one replica per node; k={k} given "
                         f"(use 'min-cost' or 'random')")
    from .spring import spring_relaxation

    spring.pop("d_min", None)  # nothing to keep apart with one replica
    return spring_relaxation(problem, **spring)

"""What a placement strategy returns: where every replica goes, and why.

A :class:`Placement` maps every node to its servers (replica ``i`` of a node
on ``replicas[node][i]``), knows its network cost and bandwidth under the
problem it was made for, and keeps one :class:`Decision` per replica: the
chosen server, the cost that replica added, and the best rejected
alternatives with the reason each was rejected (``cost``, ``load``,
``d_min``, ``holds a replica``).

>>> from replistream.placement.model import PlacementProblem
>>> p = PlacementProblem(["a", "b"], [[0, 5], [5, 0]], [("s", "o", 2.0)], fixed={"s": "a"})
>>> pl = Placement(p, {"o": ["a", "b"]}, "given")
>>> pl.network_cost, pl.bandwidth, pl.plan()
(10.0, 4.0, {'o': ['a', 'b']})
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .model import PlacementProblem

__all__ = ["Alternative", "Decision", "Placement"]


@dataclass(frozen=True)
class Alternative:
    """A server that was not chosen for a replica: its cost there and why it lost.

    ``reason``: ``"cost"`` (feasible, but costlier), ``"load"`` (load + load of
    the replica would not stay below alpha x capacity), ``"d_min"`` (too close
    to a server holding a replica of the same node), ``"holds a replica"``.

    >>> Alternative("paris", 12.5, "d_min", "8.1 ms from london <= d_min 30 ms")
    Alternative(server='paris', cost=12.5, reason='d_min', detail='8.1 ms from london <= d_min 30 ms')
    """

    server: str
    cost: float
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class Decision:
    """Where one replica went: node, replica number (0-based), phase (1-based), server,
    the network cost it added (to the replicas placed before it), how it was
    chosen, and the best rejected alternatives.

    >>> Decision("join", 1, 2, "tokyo", 40.0, "Algorithm 5").describe()
    'join#1 (phase 2) -> tokyo: cost 40 (Algorithm 5)'
    """

    node: str
    replica: int
    phase: int
    server: str
    cost: float
    how: str
    alternatives: tuple[Alternative, ...] = ()

    def describe(self) -> str:
        """One line; rejected alternatives follow on indented lines."""
        lines = [f"{self.node}#{self.replica} (phase {self.phase}) -> {self.server}: cost {self.cost:.6g} ({self.how})"]
        for a in self.alternatives:
            extra = f" {a.detail}" if a.detail else ""
            lines.append(f"    not {a.server}: cost {a.cost:.6g}, rejected for {a.reason}{extra}")
        return "\n".join(lines)


@dataclass
class Placement:
    """Replicas of every node on servers, for one :class:`~replistream.placement.model.PlacementProblem`.

    ``replicas[node]`` lists the servers of the node's replicas in replica
    order; ``strategy`` and ``params`` say how it was made; ``decisions`` explain it.
    :meth:`plan` adds the fixed applications so that the result can be passed
    to ``replistream.deploy(..., placement=...)``.

    >>> from replistream.placement.model import PlacementProblem
    >>> p = PlacementProblem(["a", "b"], [[0, 5], [5, 0]], [("s", "o", 2.0), ("o", "app", 1.0)],
    ...                      fixed={"s": "a", "app": "b"})
    >>> Placement(p, {"o": ["a"]}, "given").plan()
    {'o': ['a'], 'app': ['b']}
    """

    problem: PlacementProblem
    replicas: dict[str, list[str]]
    strategy: str
    params: dict[str, Any] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)

    def __post_init__(self):
        for node in self.problem.nodes:
            if node not in self.replicas:
                raise ValueError(f"placement has no servers for {node!r}")

    @property
    def k(self) -> int:
        """The largest number of replicas of any node."""
        return max((len(v) for v in self.replicas.values()), default=0)

    @property
    def network_cost(self) -> float:
        """Sum of rate x latency over all stream replicas (Hwang §V-A)."""
        return self.problem.network_cost(self.replicas)

    @property
    def bandwidth(self) -> float:
        """Sum of the rates of all stream replicas."""
        return self.problem.bandwidth(self.replicas)

    def plan(self) -> dict[str, list[str]]:
        """``{node: [server, ...]}`` for every placed node and every fixed endpoint that
        is not a flow's origin only (i.e. pinned applications; sources are omitted)."""
        out = {n: list(v) for n, v in self.replicas.items()}
        for name, i in self.problem.fixed.items():
            if any(f.dst == name for f in self.problem.flows):
                out[name] = [self.problem.servers[i]]
        return out

    def server_loads(self) -> dict[str, float]:
        """Load of every server after this placement."""
        return dict(zip(self.problem.servers, self.problem.server_loads(self.replicas).tolist()))

    def stream_replicas(self) -> list[dict]:
        """Every stream replica with its endpoints, rate, latency and cost."""
        return self.problem.stream_replicas(self.replicas)

    def relative_to(self, base: "Placement") -> dict[str, float]:
        """Bandwidth and network cost as multiples of ``base``'s (the paper's Fig. 4 ratios).

        >>> from replistream.placement.model import PlacementProblem
        >>> p = PlacementProblem(["a", "b"], [[0, 5], [5, 0]], [("s", "o", 2.0)], fixed={"s": "a"})
        >>> Placement(p, {"o": ["a", "b"]}, "x").relative_to(Placement(p, {"o": ["b"]}, "y"))
        {'bandwidth': 2.0, 'network_cost': 1.0}
        """
        bw, cost = base.bandwidth, base.network_cost
        return {"bandwidth": self.bandwidth / bw if bw else float("nan"),
                "network_cost": self.network_cost / cost if cost else float("nan")}

    def explain(self) -> str:
        """Every decision, one line each, with the rejected alternatives.

        >>> from replistream.placement.model import PlacementProblem
        >>> p = PlacementProblem(["a", "b"], [[0, 5], [5, 0]], [("s", "o", 2.0)], fixed={"s": "a"})
        >>> print(Placement(p, {"o": ["b"]}, "given").explain())
        given placement, k=1, network cost 10, bandwidth 2
        """
        head = (f"{self.strategy} placement, k={self.k}, network cost {self.network_cost:.6g}, "
                f"bandwidth {self.bandwidth:.6g}")
        return "\n".join([head] + [d.describe() for d in self.decisions])

    def to_dict(self, stream_replicas: bool = False) -> dict[str, Any]:
        """A JSON-ready summary: strategy, params, plan, cost, bandwidth, decisions.

        >>> from replistream.placement.model import PlacementProblem
        >>> p = PlacementProblem(["a", "b"], [[0, 5], [5, 0]], [("s", "o", 2.0)], fixed={"s": "a"})
        >>> sorted(Placement(p, {"o": ["b"]}, "given").to_dict())[:4]
        ['bandwidth', 'decisions', 'k', 'network_cost']
        """
        out = {"strategy": self.strategy, "params": dict(self.params), "k": self.k,
               "network_cost": self.network_cost, "bandwidth": self.bandwidth,
               "remote_bandwidth": self.problem.bandwidth(self.replicas, remote_only=True),
               "placement": self.plan(), "server_loads": self.server_loads(),
               "decisions": [asdict(d) for d in self.decisions]}
        if stream_replicas:
            out["stream_replicas"] = self.stream_replicas()
        return out

    def to_json(self, **kw) -> str:
        """:meth:`to_dict` as JSON."""
        return json.dumps(self.to_dict(**kw))

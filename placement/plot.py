"""Draw a placement on a world map (a plain longitude/latitude projection).

Servers are grey dots; the replicas of every node are coloured markers on
their servers (slightly offset so co-located replicas stay visible); fixed
endpoints (stream sources, pinned applications) are black triangles; stream
replicas between different servers are lines whose width grows with their rate.
Uses matplotlib's non-interactive Agg backend.

>>> import tempfile, os
>>> from replistream.network import default_servers
>>> from replistream.workloads import fig1_query
>>> from replistream.placement import PlacementPolicy, fig1_sources
>>> servers = default_servers(6)
>>> pl = PlacementPolicy(sources=fig1_sources).placement(fig1_query(3), servers, 2)
>>> path = os.path.join(tempfile.mkdtemp(), "p.png")
>>> plot_placement(pl, servers, path) == path and open(path, "rb").read(4) == b"\\x89PNG"
True
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..network import Server
from .result import Placement

__all__ = ["plot_placement"]


def plot_placement(placement: Placement, servers: Sequence[Server], path: str, title: str | None = None) -> str:
    """Write a PNG of ``placement`` over ``servers`` (which need coordinates) to ``path``; returns ``path``.

    >>> import tempfile, os
    >>> from replistream.network import default_servers
    >>> from replistream.placement import PlacementPolicy
    >>> from replistream.workloads import fig1_query
    >>> pl = PlacementPolicy().placement(fig1_query(2), default_servers(4), 2)
    >>> os.path.getsize(plot_placement(pl, default_servers(4), os.path.join(tempfile.mkdtemp(), "x.png"))) > 0
    True
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    where = {s.name: (s.lon, s.lat) for s in servers}
    missing = [s.name for s in servers if not s.located]
    if missing:
        raise ValueError(f"plotting needs server coordinates; no lat/lon for {missing[:5]}")
    fig, ax = plt.subplots(figsize=(12, 6.2))
    ax.set_xlim(-180, 180)
    ax.set_ylim(-90, 90)
    ax.set_xticks(range(-180, 181, 60))
    ax.set_yticks(range(-90, 91, 30))
    ax.grid(True, color="#dddddd", linewidth=0.6)
    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")
    xs = np.array([where[s.name][0] for s in servers])
    ys = np.array([where[s.name][1] for s in servers])
    ax.scatter(xs, ys, s=18, color="#bbbbbb", zorder=2, label="server")
    for s in servers:
        ax.annotate(s.name, where[s.name], fontsize=6, color="#888888", xytext=(3, 3), textcoords="offset points")

    streams = [r for r in placement.stream_replicas() if r["src_server"] != r["dst_server"]]
    if streams:
        top = max(r["rate"] for r in streams) or 1.0
        for r in streams:
            (x0, y0), (x1, y1) = where[r["src_server"]], where[r["dst_server"]]
            ax.plot([x0, x1], [y0, y1], color="#4477aa", alpha=0.25,
                    linewidth=0.4 + 2.6 * math.sqrt(r["rate"] / top), zorder=1)

    nodes = list(placement.replicas)
    cmap = plt.get_cmap("tab10" if len(nodes) <= 10 else "tab20")
    count: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for srv in placement.replicas[node]:
            j = count.get(srv, 0)
            count[srv] = j + 1
            x, y = where[srv]
            angle = 2 * math.pi * j / 8
            off = 2.2 * (1 + j // 8) if j else 0.0
            ax.scatter([x + off * math.cos(angle)], [y + off * math.sin(angle)], s=60, color=cmap(i % cmap.N),
                       edgecolor="black", linewidth=0.5, zorder=4, label=node if srv == placement.replicas[node][0] else None)
    fixed = placement.problem.fixed
    if fixed:
        fx = [where[placement.problem.servers[s]] for s in fixed.values()]
        ax.scatter([p[0] for p in fx], [p[1] for p in fx], marker="^", s=30, color="black", zorder=3,
                   label="source / pinned application")
    ax.legend(loc="lower left", fontsize=7, ncol=2, framealpha=0.85)
    ax.set_title(title or f"{placement.strategy} placement, k={placement.k}, network cost "
                          f"{placement.network_cost:.4g}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

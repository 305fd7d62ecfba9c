"""Draw a placement on a world map (a plain longitude/latitude projection).

Every server hosting replicas gets a ring of coloured markers, one per
replica, and a label naming what runs there; other servers are grey dots;
fixed endpoints (stream sources, pinned applications) are black triangles;
stream replicas between different servers are lines whose width grows with
their rate (a legend gives three widths' rates); the title gives the network
cost with its unit.
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

    Every server that hosts replicas gets a ring of markers, one per replica, coloured by
    node, and a label listing what runs there; other servers are grey dots with their
    name in small type; fixed endpoints (stream sources, pinned applications) are black
    triangles. A stream replica between two servers is a line whose width grows with its
    rate; the legend gives the rate of three widths. The title gives the network cost
    (the sum of rate x latency, Hwang §V-A) with its unit.

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
    from matplotlib.lines import Line2D

    where = {s.name: (s.lon, s.lat) for s in servers}
    missing = [s.name for s in servers if not s.located]
    if missing:
        raise ValueError(f"plotting needs server coordinates; no lat/lon for {missing[:5]}")
    fig, ax = plt.subplots(figsize=(13, 6.8))
    ax.set_xlim(-180, 180)
    ax.set_ylim(-90, 90)
    ax.set_xticks(range(-180, 181, 60))
    ax.set_yticks(range(-90, 91, 30))
    ax.grid(True, color="#e4e4e4", linewidth=0.6)
    ax.set_xlabel("longitude (degrees)")
    ax.set_ylabel("latitude (degrees)")

    nodes = list(placement.replicas)
    hosted: dict[str, list[str]] = {}
    for node in nodes:
        for srv in placement.replicas[node]:
            hosted.setdefault(srv, []).append(node)
    fixed_at = {placement.problem.servers[i] for i in placement.problem.fixed.values()}

    # stream replicas between servers: width by rate, with a legend of three widths
    streams = [r for r in placement.stream_replicas() if r["src_server"] != r["dst_server"]]
    top = max((r["rate"] for r in streams), default=0.0) or 1.0

    def width(rate: float) -> float:
        return 0.4 + 3.0 * math.sqrt(rate / top)

    for r in streams:
        (x0, y0), (x1, y1) = where[r["src_server"]], where[r["dst_server"]]
        ax.plot([x0, x1], [y0, y1], color="#4477aa", alpha=0.3, linewidth=width(r["rate"]), zorder=1)

    # servers without replicas: grey, small names placed away from each other
    idle = [s for s in servers if s.name not in hosted]
    ax.scatter([s.lon for s in idle], [s.lat for s in idle], s=14, color="#bbbbbb", zorder=2)
    taken: list[tuple[float, float, float, float]] = []  # label boxes placed so far (x0, y0, x1, y1), degrees

    def free_spot(x: float, y: float, text: str, size: float) -> tuple[float, float]:
        """Where to put ``text`` (font ``size`` pt) near (x, y) without overlapping labels already placed:
        the first of a few candidate offsets whose box is free (text extents estimated in degrees:
        this figure shows about 28 degrees per inch)."""
        w, h = 0.6 * size / 72 * 28 * len(text), 1.3 * size / 72 * 28
        for dx, dy in ((1.5, 1.5), (1.5, -1.5 - h), (-1.5 - w, 1.5), (-1.5 - w, -1.5 - h), (1.5, 2 + h),
                       (-w / 2, 3 + h), (-w / 2, -3 - 2 * h), (1.5, -3 - 2 * h), (-1.5 - w, 2 + h)):
            box = (x + dx, y + dy, x + dx + w, y + dy + h)
            if all(box[2] < b[0] or box[0] > b[2] or box[3] < b[1] or box[1] > b[3] for b in taken):
                taken.append(box)
                return box[0], box[1]
        taken.append((x + 1.5, y + 1.5, x + 1.5 + w, y + 1.5 + h))
        return x + 1.5, y + 1.5

    # servers with replicas: one marker per replica on a ring, and what runs there
    cmap = plt.get_cmap("tab10" if len(nodes) <= 10 else "tab20")
    colour = {node: cmap(i % cmap.N) for i, node in enumerate(nodes)}
    for srv in sorted(hosted, key=lambda s: -len(hosted[s])):
        x, y = where[srv]
        here = hosted[srv]
        ring = 3.2 if len(here) > 1 else 0.0
        for j, node in enumerate(here):
            a = 2 * math.pi * j / len(here)
            ax.scatter([x + ring * math.cos(a)], [y + 0.8 * ring * math.sin(a)], s=55, color=colour[node],
                       edgecolor="black", linewidth=0.5, zorder=4)
        text = f"{srv}: " + ", ".join(here)
        lx, ly = free_spot(x + ring, y + ring, text, 7.5)
        ax.annotate(text, (x, y), xytext=(lx, ly), textcoords="data", fontsize=7.5,
                    zorder=5, bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="#999999", alpha=0.85),
                    arrowprops=dict(arrowstyle="-", color="#999999", lw=0.6))
    for s in idle:
        lx, ly = free_spot(s.lon, s.lat, s.name, 6)
        ax.annotate(s.name, (s.lon, s.lat), xytext=(lx, ly), textcoords="data", fontsize=6, color="#777777")
    if fixed_at:
        ax.scatter([where[s][0] for s in fixed_at], [where[s][1] for s in fixed_at], marker="^", s=34,
                   color="black", zorder=3)

    handles = [Line2D([], [], marker="o", ls="", color=colour[n], markeredgecolor="black", markersize=7,
                      label=f"replica of {n}") for n in nodes]
    handles.append(Line2D([], [], marker="o", ls="", color="#bbbbbb", markersize=5, label="server, no replica"))
    if fixed_at:
        handles.append(Line2D([], [], marker="^", ls="", color="black", markersize=6,
                              label="stream source / pinned application"))
    if streams:
        for rate in (top, top / 4, top / 16):
            handles.append(Line2D([], [], color="#4477aa", alpha=0.5, linewidth=width(rate),
                                  label=f"stream replica, {rate:,.0f} bytes/s"))
    ax.legend(handles=handles, loc="lower left", fontsize=7, ncol=2, framealpha=0.9)
    ax.set_title(title or f"{placement.strategy} placement, k={placement.k}: network cost "
                          f"{placement.network_cost:,.0f} bytes/s x ms (sum of rate x latency over stream replicas)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

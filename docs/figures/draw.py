"""Draw the two pictures of the docs with matplotlib: ``python docs/figures/draw.py``.

* ``replicated_query.png`` (README): a query of two sources, a Join and an Aggregate, k = 2,
  on three servers: every upstream replica feeds every downstream replica, the application's
  duplicate filter keeps the first copy of each tuple.
* ``architecture.png`` (docs/architecture.md): the processes of a deployment, the actors in
  them, the data path and the control path.

Both are drawings of the design (docs/design.md), not measurements.
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA, CONTROL = "#1f5fa8", "#b0522a"


def box(ax, x, y, w, h, text, fc="#ffffff", ec="#333333", size=9, bold=False, ls="-", z=2):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=fc, ec=ec,
                                lw=1.2, ls=ls, zorder=z))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, zorder=z + 1,
            fontweight="bold" if bold else "normal")
    return (x, y, w, h)


def arrow(ax, a, b, color=DATA, ls="-", lw=1.1, rad=0.0, z=1):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=10, color=color, lw=lw, ls=ls,
                                 connectionstyle=f"arc3,rad={rad}", zorder=z, shrinkA=2, shrinkB=2))


def right(b):
    return (b[0] + b[2], b[1] + b[3] / 2)


def left(b):
    return (b[0], b[1] + b[3] / 2)


def replicated_query(path: str) -> None:
    fig, ax = plt.subplots(figsize=(10, 4.6))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4.6)
    ax.axis("off")
    servers = {"boston": "#eef4fb", "london": "#f4f8ec", "tokyo": "#fbf1ea"}
    # columns: sources, entry points, Join, Aggregate, application
    src = {"load": box(ax, 0.1, 3.0, 1.0, 0.5, "source\nload", fc="#f2f2f2"),
           "ping": box(ax, 0.1, 1.2, 1.0, 0.5, "source\nping", fc="#f2f2f2")}
    place = {("entry", 0): "boston", ("entry", 1): "london", ("join", 0): "london", ("join", 1): "tokyo",
             ("window", 0): "boston", ("window", 1): "tokyo"}
    col = {"entry": 1.8, "join": 4.0, "window": 6.2}
    reps = {}
    for (op, i), srv in place.items():
        y = 3.0 - i * 1.8
        reps[(op, i)] = box(ax, col[op], y, 1.5, 0.62, f"{op}#{i}\non {srv}", fc=servers[srv], size=8.5)
    app = box(ax, 8.4, 1.9, 1.5, 0.9, "application\nalerts\n(duplicate filter)", fc="#fff9d6", size=8.5,
              bold=True)
    for s in src.values():
        for i in range(2):
            arrow(ax, right(s), left(reps[("entry", i)]))
    for a, b in (("entry", "join"), ("join", "window")):
        for i in range(2):
            for j in range(2):
                arrow(ax, right(reps[(a, i)]), left(reps[(b, j)]), rad=0.05 if i != j else 0.0)
    for i in range(2):
        arrow(ax, right(reps[("window", i)]), left(app))
    for n, (srv, c) in enumerate(servers.items()):
        ax.add_patch(FancyBboxPatch((0.15 + n * 1.25, 0.12), 1.1, 0.32, boxstyle="round,pad=0.02", fc=c,
                                    ec="#999999", lw=0.8))
        ax.text(0.7 + n * 1.25, 0.28, srv, ha="center", va="center", fontsize=8)
    ax.text(4.1, 0.28, "k = 2 replicas of every operator on distinct servers; every upstream replica feeds "
                       "every downstream replica;\nthe first copy of each tuple wins, so the application gets "
                       "exactly one failure-free run's output", fontsize=8, va="center")
    ax.set_title("A replicated query on three servers", fontsize=11)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def architecture(path: str) -> None:
    fig, ax = plt.subplots(figsize=(11, 6.4))
    ax.set_xlim(0, 11)
    ax.set_ylim(0, 6.4)
    ax.axis("off")
    # the driver's process
    ax.add_patch(FancyBboxPatch((0.1, 0.3), 2.4, 5.7, boxstyle="round,pad=0.02", fc="#f7f7f7", ec="#666666",
                                ls="--", lw=1))
    ax.text(1.3, 5.8, "your script (driver)", ha="center", fontsize=9, fontweight="bold")
    dep = box(ax, 0.3, 4.2, 2.0, 1.3, "Deployment: deploy()\nfailure detector, monitor,\nGC / revival loop, repair\n"
                                      "(detached: in the host,\nthe script holds a client)", fc="#fbe9e1", size=7.5)
    feed = box(ax, 0.3, 2.9, 2.0, 0.8, "feeder: chunks of\ninputs, FileSource,\nSparkSource", size=8)
    res = box(ax, 0.3, 1.2, 2.0, 0.9, "results: RunResult,\nwait() -> WaitSummary", size=8)
    # the Ray cluster
    ax.add_patch(FancyBboxPatch((2.9, 0.3), 8.0, 5.7, boxstyle="round,pad=0.02", fc="#fbfbff", ec="#666666",
                                ls="--", lw=1))
    ax.text(6.9, 5.8, "Ray cluster (one process per actor; `replistream up` keeps one between scripts)",
            ha="center", fontsize=9, fontweight="bold")
    coord = box(ax, 3.2, 4.4, 2.3, 0.9, "CoordinatorActor\nplan, placements, reports\nlog (kept in Ray's KV store)",
                fc="#fbe9e1", size=8)
    host = box(ax, 5.9, 4.4, 2.2, 0.9, "DeploymentHost\nholds a detached\ndeployment's Deployment", fc="#fbe9e1",
               size=8)
    warm = box(ax, 8.4, 4.4, 2.3, 0.9, "WarmPool\nidle actor processes\n(replistream up)", fc="#f2f2f2", size=8)
    entry = [box(ax, 3.2, 2.9 - i * 1.3, 1.5, 0.8, f"EntryActor #{i}\nsorts, punctuates", fc="#eef4fb", size=8)
             for i in range(2)]
    ops = [box(ax, 5.3, 2.9 - i * 1.3, 1.8, 0.8, f"ReplicaActor #{i}\noperator + dup filter", fc="#eef4fb",
               size=8) for i in range(2)]
    apps = [box(ax, 7.7, 2.9 - i * 1.3, 1.5, 0.8, f"SinkActor #{i}\napplication", fc="#fff9d6", size=8)
            for i in range(2)]
    pq = box(ax, 9.5, 2.25, 1.3, 0.9, "ParquetSink\nfolder", fc="#f2f2f2", size=8)
    for e in entry:
        arrow(ax, right(feed), left(e))
    for e in entry:
        for o in ops:
            arrow(ax, right(e), left(o))
    for o in ops:
        for a in apps:
            arrow(ax, right(o), left(a))
    for a in apps:
        arrow(ax, right(a), left(pq))
        arrow(ax, left(a), right(res), rad=-0.25)
    for target in (*entry, *ops, *apps):
        arrow(ax, (dep[0] + dep[2], dep[1] + 0.2), (target[0] + target[2] / 2, target[1] + target[3]),
              color=CONTROL, ls="--", lw=0.8)
    arrow(ax, (dep[0] + dep[2], dep[1] + 1.0), left(coord), color=CONTROL, ls="--")
    arrow(ax, (host[0], host[1] + 0.2), (dep[0] + dep[2], dep[1] + 0.6), color=CONTROL, ls=":", rad=0.15)
    arrow(ax, (warm[0] + 0.4, warm[1]), (apps[0][0] + 1.2, apps[0][1] + apps[0][3]), color="#777777", ls=":",
          lw=0.9)
    ax.plot([], [], color=DATA, lw=1.5, label="data: tuples and punctuations (batched FIFO stream replicas)")
    ax.plot([], [], color=CONTROL, lw=1.5, ls="--", label="control: probes, reports, kills, transfers, changes")
    ax.plot([], [], color="#777777", lw=1.5, ls=":", label="a warm actor leased to a deployment")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, -0.06), ncol=3, fontsize=8, frameon=False)
    ax.set_title("replistream on Ray: processes, actors, data and control paths", fontsize=11)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    replicated_query(os.path.join(HERE, "replicated_query.png"))
    architecture(os.path.join(HERE, "architecture.png"))
    print("wrote", os.path.join(HERE, "replicated_query.png"), "and", os.path.join(HERE, "architecture.png"))

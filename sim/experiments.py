"""The paper's experiments in the simulator (Hwang §VI, Fig. 2-5, Table I).

Each experiment is a function ``name(quick=False, seed=0, out=None, progress=False) -> dict``
that runs the simulations, writes ``<out>/<name>.png`` (matplotlib, Agg) and
``<out>/<name>.json`` plus ``<out>/<name>.csv`` when ``out`` is given, and
returns the data; :func:`table` formats the short table the CLI prints.
``quick=True`` is a reduced scale that runs in under a minute (what the tests
use); the full scale is what docs/experiments.md reports.

The setting, shared by Fig. 3-5 (§VI-A): the first 30 built-in cities as the
cluster (:func:`~replistream.network.default_servers`), the time-varying
:class:`~replistream.network.GeoLatencyModel` (:func:`~replistream.sim.traces.month_model`),
the Fig. 1 query (:func:`~replistream.workloads.fig1_query`, join window
10 s, Filters pass everything) with ``load_i`` and ``ping_i`` sources on
server ``i`` (:func:`~replistream.placement.fig1_sources`) reporting every
10 s, rates measured in a 600 s reference test run
(:meth:`~replistream.placement.QueryStats.from_run`), and placement by
:func:`~replistream.placement.min_cost` (Algorithm 5 after spring
relaxation; alpha 0.8, d_min 30 ms) or random.

>>> sorted(EXPERIMENTS)
['fig4']
"""
from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from replistream.engine import run_reference
from replistream.network import default_servers
from replistream.placement import QueryStats, fig1_sources, latency_matrix, min_cost, place, problem_from_query
from replistream.placement.result import Placement
from replistream.workloads import fig1_inputs, fig1_query

from .cpu import MEASURED_CPU_S, PAPER_TABLE1, TABLE1_INPUT_TUPLES, CpuModel, fit_costs
from .engine import Simulator
from .traces import month_model

__all__ = ["EXPERIMENTS", "CCDF_POINTS", "ccdf", "Setting", "fig1_setting", "random_extension",
           "fig2", "fig3", "fig4", "fig5", "table1", "table", "run_experiment"]

#: Latencies (s) at which the CCDF is reported: the x axis of the paper's Fig. 4.
CCDF_POINTS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def ccdf(latencies: np.ndarray, points=CCDF_POINTS) -> list[float]:
    """P(latency > x) for each x in ``points`` (Fig. 4's y axis).

    >>> ccdf(np.array([0.05, 0.2, 0.3, 5.0]), (0.1, 1.0))
    [0.75, 0.25]
    """
    lat = np.asarray(latencies, dtype=float)
    if lat.size == 0:
        return [float("nan")] * len(points)
    return [float(np.mean(lat > x)) for x in points]


@dataclass
class Setting:
    """One experimental setting: the cluster, network, query, inputs and placement problem."""

    servers: list
    network: Any
    query: Any
    inputs: dict
    sources: dict
    problem: Any
    duration_s: float

    def base_placement(self) -> Placement:
        """The non-replicated, minimum-cost placement every strategy starts from (§VI-A)."""
        return min_cost(self.problem, 1)


def fig1_setting(n_servers: int = 30, monitored: int = 30, duration_s: float = 3600.0, seed: int = 0,
                 period_s: float = 10.0, window_s: float = 10.0, static: bool = False) -> Setting:
    """The §VI-A setting: ``monitored`` servers each running a load and a ping source.

    >>> s = fig1_setting(n_servers=6, monitored=3, duration_s=60)
    >>> len(s.servers), len(s.query.sources), s.problem.nodes[0]
    (6, 6, 'entry')
    """
    servers = default_servers(n_servers)
    net = month_model(n_servers, seed=seed, static=static)
    q = fig1_query(monitored, window_s=window_s)
    inputs = fig1_inputs(monitored, duration_s=duration_s, period_s=period_s, seed=seed)
    test = fig1_inputs(monitored, duration_s=600.0, period_s=period_s, seed=seed + 1)
    stats = QueryStats.from_run(q, run_reference(q, test), 600.0)
    sources = fig1_sources(q, servers)
    problem = problem_from_query(q, servers, latency_matrix(net, net.names), stats, sources=sources)
    return Setting(servers, net, q, inputs, sources, problem, duration_s)


def random_extension(problem, base: Placement, k: int, seed: int = 0) -> Placement:
    """Fig. 4(a)'s random deployment: the non-replicated placement ``base``, then replicas
    2..k of every replicated node on seeded random servers that do not hold one yet.

    >>> from replistream.placement.model import PlacementProblem
    >>> p = PlacementProblem(list("abcd"), np.zeros((4, 4)), [("s", "o", 1.0)], fixed={"s": "a"})
    >>> base = Placement(p, {"o": ["a"]}, "given")
    >>> r = random_extension(p, base, 3, seed=1); r.replicas["o"][0], len(set(r.replicas["o"]))
    ('a', 3)
    """
    rng = np.random.default_rng(seed)
    reps = {n: list(v[:1]) for n, v in base.replicas.items()}
    for _phase in range(2, k + 1):
        for node in problem.nodes:
            if node in problem.single:
                continue
            free = [s for s in problem.servers if s not in reps[node]]
            if not free:
                raise ValueError(f"k={k}: no free server left for another replica of {node!r}")
            reps[node].append(free[int(rng.integers(len(free)))])
    return Placement(problem, reps, "random", {"k": k, "seed": seed, "base": base.strategy})


def _simulate(setting: Setting, plan: dict, progress: bool = False, **kw):
    sim = Simulator(setting.query, plan, setting.network, sources=setting.sources, **kw)
    return sim.run(setting.inputs, progress=progress)


def _check_exact(setting: Setting, res, ref=None) -> None:
    """Every simulated run must deliver exactly the ideal output (replication transparency)."""
    from replistream.testing import assert_same_output

    ref = ref if ref is not None else run_reference(setting.query, setting.inputs)
    for app in setting.query.sinks:
        assert_same_output(ref.outputs[app], res.outputs[app])


# -- Fig. 4 --------------------------------------------------------------------------------------

def fig4(quick: bool = False, seed: int = 0, out: str | None = None, progress: bool = False,
         kmax: tuple[int, ...] = (1, 2, 3, 4, 5)) -> dict:
    """Fig. 4: latency CCDF of random versus min-cost deployment for kmax = 1..5, with the
    bandwidth and network cost relative to kmax = 1 (Hwang §VI-E).

    Random deployment puts every replica, the first included, on a seeded random
    server (:func:`~replistream.placement.random_placement`); both strategies'
    ratios are relative to the non-replicated minimum-cost placement (the
    paper's "non-replication case"). Full scale: 30 servers, 10 monitored, 6
    simulated hours. Quick: 30 servers, 5 monitored, 30 simulated minutes.
    Every run's output is checked against the reference.
    """
    monitored, hours = (5, 0.5) if quick else (10, 6.0)
    st = fig1_setting(30, monitored, hours * 3600.0, seed=seed)
    ref = run_reference(st.query, st.inputs)
    base = st.base_placement()
    rows = []
    for strategy in ("min-cost", "random"):
        for k in kmax:
            t0 = time.time()
            if strategy == "min-cost":
                pl = base if k == 1 else min_cost(st.problem, k)
            else:
                pl = place(st.problem, k, "random", seed=seed)
            res = _simulate(st, pl.plan(), progress=progress)
            _check_exact(st, res, ref)
            lat = np.concatenate([res.latencies(a)[1] for a in st.query.sinks])
            rel = pl.relative_to(base)
            rows.append({"strategy": strategy, "k": k, "tuples": int(lat.size),
                         "ccdf": dict(zip(map(str, CCDF_POINTS), ccdf(lat))),
                         "p50_s": float(np.median(lat)), "p99_s": float(np.percentile(lat, 99)),
                         "p999_s": float(np.percentile(lat, 99.9)), "max_s": float(lat.max()),
                         "bandwidth_ratio": rel["bandwidth"], "cost_ratio": rel["network_cost"],
                         "network_cost": pl.network_cost, "plan": pl.plan(), "wall_s": time.time() - t0})
    data = {"experiment": "fig4", "quick": quick, "seed": seed, "servers": 30, "monitored": monitored,
            "simulated_hours": hours, "ccdf_points_s": list(CCDF_POINTS), "rows": rows,
            "paper": {"min-cost": {"3": "all latencies < 1 s at (6.67x, 10.99x)"},
                      "random": {"3": "latencies beyond 16 s at (6.67x, 13.39x)"}}}
    if out:
        _write(out, "fig4", data, [{k: v for k, v in r.items() if k not in ("plan", "ccdf")} |
                                   {f"P(lat>{x})": r["ccdf"][str(x)] for x in CCDF_POINTS} for r in rows])
        _plot_fig4(data, os.path.join(out, "fig4.png"))
    return data


def _plot_fig4(data: dict, path: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, strategy in zip(axes, ("random", "min-cost")):
        for r in (r for r in data["rows"] if r["strategy"] == strategy):
            ys = [max(r["ccdf"][str(x)], 1e-6) for x in data["ccdf_points_s"]]
            ax.plot(data["ccdf_points_s"], ys, marker="o",
                    label=f"kmax={r['k']} ({r['bandwidth_ratio']:.2f}x, {r['cost_ratio']:.2f}x)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(1e-6, 1.5)
        ax.set_xlabel("latency (s)")
        ax.set_title(f"({'a' if strategy == 'random' else 'b'}) {strategy}")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("P(latency > x)")
    fig.suptitle(f"Fig. 4: {data['simulated_hours']:g} simulated hours, {data['monitored']} monitored servers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- helpers -----------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _jsonable(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _write(out: str, name: str, data: dict, rows: list[dict]) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1, default=_jsonable)
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, keys)
            w.writeheader()
            for r in rows:
                w.writerow({k: (json.dumps(v, default=_jsonable) if isinstance(v, (dict, list)) else v)
                            for k, v in r.items()})


def table(data: dict) -> str:
    """The short table an experiment prints (one line per row of its data).

    >>> print(table({"experiment": "fig4", "rows": [{"strategy": "min-cost", "k": 1, "p50_s": 0.1,
    ...     "p99_s": 0.2, "max_s": 0.3, "bandwidth_ratio": 1.0, "cost_ratio": 1.0, "ccdf": {"1.0": 0.0}}]}))
    strategy  k    p50 s   p99 s   max s  P(>1 s)  bandwidth  cost
    min-cost  1    0.100   0.200   0.300  0          1.00x    1.00x
    """
    return _TABLES[data["experiment"]](data)


def _table_fig4(data: dict) -> str:
    lines = [f"{'strategy':<9} {'k':<2} {'p50 s':>7} {'p99 s':>7} {'max s':>7}  {'P(>1 s)':<8} {'bandwidth':>9}  cost"]
    for r in data["rows"]:
        lines.append(f"{r['strategy']:<9} {r['k']:<2} {r['p50_s']:>7.3f} {r['p99_s']:>7.3f} {r['max_s']:>7.3f}  "
                     f"{r['ccdf']['1.0']:<8.3g} {r['bandwidth_ratio']:>8.2f}x {r['cost_ratio']:>7.2f}x")
    return "\n".join(lines)


_TABLES: dict[str, Callable[[dict], str]] = {"fig4": _table_fig4}

EXPERIMENTS: dict[str, Callable[..., dict]] = {"fig4": fig4}


def run_experiment(name: str, quick: bool = False, seed: int = 0, out: str | None = None,
                   progress: bool = False) -> dict:
    """Run experiment ``name`` (one of :data:`EXPERIMENTS`).

    >>> run_experiment("fig9")
    Traceback (most recent call last):
    ...
    ValueError: unknown experiment 'fig9'; known: fig4
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    return EXPERIMENTS[name](quick=quick, seed=seed, out=out, progress=progress)

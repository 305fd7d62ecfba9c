"""The paper's experiments in the simulator (Hwang §VI, Fig. 2-5, Table I).

Each experiment is a function ``name(quick=False, seed=0, out=None, progress=False) -> dict``
that runs the simulations, writes ``<out>/<name>.png`` (matplotlib, Agg) and
``<out>/<name>.json`` plus ``<out>/<name>.csv`` when ``out`` is given, and
returns the data; :func:`table` formats the short table the CLI prints.
``quick=True`` is a reduced scale that runs in seconds (what the tests use; fig4, the longest,
about 30 s); the full scale is what docs/experiments.md reports.

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

Beyond the paper, :func:`rescale` runs a partitioned operator's live rescaling (issue #41;
Megaphone §5) with each strategy in simulated time.

>>> sorted(EXPERIMENTS)
['fig2', 'fig3', 'fig4', 'fig5', 'rescale', 'table1']
"""
from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from replistream.engines import run_reference
from replistream.engines.result import latency_s
from replistream.network import default_servers
from replistream.partition import ENTRY
from replistream.placement import (QueryStats, application_partition_layout, cost_with_application_partitions,
                                   entry_partition_layout, fig1_sources, latency_matrix, min_cost, place,
                                   problem_from_query)
from replistream.placement.result import Placement
from replistream.workloads import fig1_inputs, fig1_query

from .cpu import MEASURED_CPU_S, PAPER_TABLE1, PAPER_TABLE1_RATIOS, TABLE1_INPUT_TUPLES, fit_costs
from .engine import Simulator
from .traces import month_model

__all__ = ["EXPERIMENTS", "CCDF_POINTS", "ccdf", "Setting", "fig1_setting", "random_extension",
           "fig2", "fig3", "fig4", "fig5", "table1", "rescale", "RESCALE_STRATEGIES", "table", "verdict",
           "run_experiment"]

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
    rates: dict  # bytes/s of each node's output stream, from the test run (the placement problem's rates)
    #: ``{operator: p}``: operators run as ``p`` partitions (issue #41); the problem has a node per partition
    parallelism: dict = field(default_factory=dict)
    bits: int | None = None  # the bins of the partitioned operators' keys (None: the default)
    #: the entry points' partitions (1: unpartitioned); placed as one node, laid out on its servers
    entry: int = 1
    #: ``{application: p}``: applications run as ``p`` partitions, placed as one node and spread from its server
    applications: dict = field(default_factory=dict)

    def base_placement(self) -> Placement:
        """The non-replicated, minimum-cost placement every strategy starts from (§VI-A)."""
        return min_cost(self.problem, 1)

    def partitions(self) -> dict:
        """Every partitioned node and its partitions, as ``replistream place`` records them: the
        entry points, the operators, the applications (``{}`` when nothing is partitioned).

        >>> fig1_setting(n_servers=6, monitored=2, duration_s=60, parallelism={"alerts": 2, "entry": 3}).partitions()
        {'entry': 3, 'alerts': 2}
        """
        return {**({ENTRY: self.entry} if self.entry > 1 else {}), **self.parallelism, **self.applications}

    def layout(self, placement: Placement, k: int) -> dict:
        """Where the entry and application partitions of ``placement`` (of ``k`` replicas) run, laid
        out from their node's servers as ``deploy()`` and ``replistream place`` lay them out
        (:mod:`replistream.placement.layout`): ``{"entry.P": servers, "app.P": servers}``.

        >>> st = fig1_setting(n_servers=6, monitored=2, duration_s=60, parallelism={"entry": 2, "alerts": 2})
        >>> sorted(st.layout(min_cost(st.problem, 2), 2))
        ['alerts.0', 'alerts.1', 'entry.0', 'entry.1']
        """
        plan = placement.plan()
        return {**entry_partition_layout(plan, self.entry),
                **application_partition_layout(plan, self.problem.servers, k, self.applications)}

    def plan(self, placement: Placement, k: int) -> dict:
        """The simulator's plan for ``placement`` (of ``k`` replicas): its plan with each partitioned
        application's ``"app.P"`` servers (:meth:`layout`), as ``replistream place`` writes it (the entry
        partitions run on ``plan["entry"]``'s servers)."""
        plan = placement.plan()
        plan.update({n: v for n, v in self.layout(placement, k).items() if not n.startswith(f"{ENTRY}.")})
        return plan

    def costs(self, placement: Placement, k: int) -> tuple[float, float]:
        """``(network cost, bandwidth)`` of ``placement`` with the applications' partitions where
        they run (:func:`~replistream.placement.cost_with_application_partitions`); the placement's
        own when no application is partitioned (entry partitions do not change them)."""
        if not self.applications:
            return placement.network_cost, placement.bandwidth
        return cost_with_application_partitions(self.problem, placement.replicas, self.layout(placement, k),
                                                self.applications)


def fig1_setting(n_servers: int = 30, monitored: int = 30, duration_s: float = 3600.0, seed: int = 0,
                 period_s: float = 10.0, window_s: float = 10.0, static: bool = False, chunk: int = 1,
                 volatility: float = 1.0, parallelism: dict | None = None, bits: int | None = None,
                 loads: dict | None = None) -> Setting:
    """The §VI-A setting: ``monitored`` servers each running a load and a ping source.

    ``parallelism``: ``{operator: p}`` runs those operators as ``p`` key partitions (issue #41):
    the placement problem has one node per partition (``"op.P"``, Algorithm 5 per partition),
    and the setting's runs (:func:`_simulate`) route tuples to them. ``"entry": p`` runs the entry
    points as ``p`` entry partitions and ``app: p`` an application as ``p`` partitions: each is
    placed as one node and its partitions laid out from it as ``deploy()`` does
    (:meth:`Setting.layout`), checked as ``replistream place`` checks them. ``loads``: the load of one
    replica of each node, in server capacities (default none: the paper's experiments place by
    network cost only); a partition carries ``1/p`` of its operator's.

    ``volatility``: the latency model's rates of delay spikes and link outages, as multiples
    of its defaults (one spike per 600 s per direction, one outage per 12 h per link); 0 turns
    both off, 2 doubles them.

    ``chunk``: readings per input chunk (the batched engine releases each reading at its own
    time, so only speed changes); the last chunk of each source is split into single readings,
    so that the input's end (:meth:`Simulator.input_end`) is the last reading's time whatever
    ``chunk`` is.

    >>> s = fig1_setting(n_servers=6, monitored=3, duration_s=60)
    >>> len(s.servers), len(s.query.sources), s.problem.nodes[0]
    (6, 6, 'entry')
    >>> s = fig1_setting(n_servers=6, monitored=3, duration_s=60, parallelism={"correlate": 2})
    >>> [n for n in s.problem.nodes if n.startswith("correlate")], s.parallelism
    (['correlate.0', 'correlate.1'], {'correlate': 2})
    """
    servers = default_servers(n_servers)
    if not (volatility >= 0 and math.isfinite(volatility)):
        raise ValueError(f"volatility must be a finite number >= 0, got {volatility!r}")
    rates = {} if volatility == 1.0 else {"spikes": volatility / 600.0, "outages": volatility / (12 * 3600.0)}
    net = month_model(n_servers, seed=seed, static=static, **rates)
    q = fig1_query(monitored, window_s=window_s)
    inputs = fig1_inputs(monitored, duration_s=duration_s, period_s=period_s, seed=seed, chunk=chunk)
    if chunk > 1:
        for src, chunks in inputs.items():
            if chunks:
                last = chunks.pop()
                chunks.extend({k: v[i:i + 1] for k, v in last.items()} for i in range(len(last["ts"])))
    test = fig1_inputs(monitored, duration_s=600.0, period_s=period_s, seed=seed + 1)
    test_run = run_reference(q, test)
    stats = QueryStats.from_run(q, test_run, 600.0, loads=loads)
    rates = dict(stats.rates)
    sources = fig1_sources(q, servers)
    entry, operators, apps = _split_parallelism(q, parallelism, bits)
    problem = problem_from_query(q, servers, latency_matrix(net, net.names), stats, sources=sources,
                                 parallelism=operators, bits=bits)
    return Setting(servers, net, q, inputs, sources, problem, duration_s, rates, dict(problem.parallelism),
                   problem.bits, entry, apps)


def _split_parallelism(query, parallelism: dict | None, bits: int | None) -> tuple[int, dict | None, dict]:
    """``(entry partitions, {operator: p}, {application: p})`` of ``parallelism``: the entry points
    and the applications checked here (a one-line error naming the mistake), the operators by
    :func:`~replistream.placement.problem_from_query`.

    >>> _split_parallelism(fig1_query(1), {"entry": 2, "correlate": 2, "alerts": 1}, None)
    (2, {'correlate': 2}, {})
    """
    from replistream.partition import DEFAULT_BITS, check_parallelism, entry_parallelism

    entry, rest = entry_parallelism(parallelism)
    if rest is None:
        return entry, None, {}
    apps = {n: p for n, p in rest.items() if n in query.sinks}
    operators = {n: p for n, p in rest.items() if n not in apps}
    apps = check_parallelism(query, apps, DEFAULT_BITS if bits is None else bits, applications=True) if apps else {}
    return entry, operators, apps


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


def _hours(simulated_hours) -> float:
    """``simulated_hours`` checked: a finite number > 0 (a one-line ``ValueError`` otherwise).

    >>> _hours(0.5)
    0.5
    """
    if not (simulated_hours > 0 and math.isfinite(simulated_hours)):
        raise ValueError(f"simulated_hours must be a finite number > 0, got {simulated_hours!r}")
    return float(simulated_hours)


def _simulate(setting: Setting, plan: dict, progress: bool = False, **kw):
    """One simulated run of ``setting`` on ``plan`` (with its applications' partitions:
    :meth:`Setting.plan`), every partition of the setting run."""
    if setting.partitions():
        kw = {"parallelism": setting.partitions(), "bits": setting.bits, **kw}
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
         kmax: tuple[int, ...] = (1, 2, 3, 4, 5), simulated_hours: float | None = None,
         parallelism: dict | None = None, bits: int | None = None) -> dict:
    """Fig. 4: latency CCDF of random versus min-cost deployment for kmax = 1..5, with the
    bandwidth and network cost relative to the non-replicated placement (Hwang §VI-E).

    Random deployment puts every replica, the first included, on a seeded random
    server (:func:`~replistream.placement.random_placement`); both strategies'
    ratios are relative to the non-replicated minimum-cost placement (the
    paper's "non-replication case"). Full scale: 30 servers, 10 monitored, 6
    simulated hours. Quick: 30 servers, 5 monitored, 30 simulated minutes.
    ``simulated_hours``, when given, replaces the scale's simulated time (the tests run a shorter quick run).
    ``parallelism``: ``{operator: p}`` runs the query with partitioned operators, every strategy
    placing each partition's replicas, their keys cut into ``2**bits`` bins (:func:`fig1_setting`; issue #41);
    ``"entry": p`` and ``{application: p}`` run entry and application partitions, laid out from
    their node's servers as ``deploy()`` does (each row's ``partitions``; the ratios cost the
    applications' partitions where they run). Every run's output is checked against the reference.
    """
    monitored, hours = (5, 0.5) if quick else (10, 6.0)
    if simulated_hours is not None:
        hours = _hours(simulated_hours)
    st = fig1_setting(30, monitored, hours * 3600.0, seed=seed, parallelism=parallelism, bits=bits)
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
            plan = st.plan(pl, k)
            res = _simulate(st, plan, progress=progress and f"fig4 {strategy} kmax={k}")
            _check_exact(st, res, ref)
            lat = np.concatenate([res.latencies(a)[1] for a in st.query.sinks])
            rel = pl.relative_to(base)
            cost = pl.network_cost
            if st.applications:  # the applications' input reaches each partition where it runs (as place says)
                (cost, bandwidth), (base_cost, base_bandwidth) = st.costs(pl, k), st.costs(base, 1)
                rel = {"bandwidth": bandwidth / base_bandwidth, "network_cost": cost / base_cost}
            rows.append({"strategy": strategy, "k": k, "tuples": int(lat.size),
                         "ccdf": dict(zip(map(str, CCDF_POINTS), ccdf(lat))),
                         "p50_s": float(np.median(lat)), "p99_s": float(np.percentile(lat, 99)),
                         "p999_s": float(np.percentile(lat, 99.9)), "max_s": float(lat.max()),
                         "bandwidth_ratio": rel["bandwidth"], "cost_ratio": rel["network_cost"],
                         "network_cost": cost, "plan": plan, **_row_partitions(st, pl, k),
                         "wall_s": time.time() - t0})
    data = {"experiment": "fig4", "quick": quick, "seed": seed, "servers": 30, "monitored": monitored,
            **_partitioned(st), "simulated_hours": hours, "ccdf_points_s": list(CCDF_POINTS), "rows": rows,
            "paper": {"min-cost": {"3": "all latencies < 1 s at (6.67x, 10.99x)"},
                      "random": {"3": "latencies beyond 16 s at (6.67x, 13.39x)"}}}
    if out:
        _write(out, "fig4", data, [{k: v for k, v in r.items() if k not in ("plan", "ccdf")} |
                                   {f"P(lat>{x})": r["ccdf"][str(x)] for x in CCDF_POINTS} for r in rows])
        _plot_fig4(data, os.path.join(out, "fig4.png"))
    return data


def _plot_fig4(data: dict, path: str) -> None:
    """Fig. 4: the latency CCDF per kmax and strategy. Probabilities of 0 (no tuple that late in
    the run) cannot go on a log axis: they sit on a dashed floor line, as hollow markers. Lines
    that coincide stay visible: each kmax has its own line style and width, the widest drawn first."""
    plt = _pyplot()
    floor = 1e-6
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    styles = ["-", "--", "-.", ":", (0, (5, 1))]
    xs = data["ccdf_points_s"]
    for ax, strategy in zip(axes, ("random", "min-cost")):
        rows = sorted((r for r in data["rows"] if r["strategy"] == strategy), key=lambda r: r["k"])
        for j, r in enumerate(rows):
            p = [r["ccdf"][str(x)] for x in xs]
            ys = [max(v, floor) for v in p]
            width, size = 0.9 + 0.55 * (len(rows) - 1 - j), 3.5 + 1.1 * (len(rows) - 1 - j)
            line, = ax.plot(xs, ys, linestyle=styles[j % len(styles)], linewidth=width, marker="o",
                            markersize=size, zorder=2 + j,
                            label=f"kmax={r['k']}: bandwidth {r['bandwidth_ratio']:.2f}x, "
                                  f"network cost {r['cost_ratio']:.2f}x")
            zero = [i for i, v in enumerate(p) if v == 0]
            if zero:
                line.set_markevery([i for i in range(len(p)) if p[i] > 0])
                ax.plot([xs[i] for i in zero], [floor] * len(zero), linestyle="none", marker="o",
                        markersize=size, markerfacecolor="white", markeredgecolor=line.get_color(), zorder=2 + j)
        ax.axhline(floor, color="#888888", linestyle="--", linewidth=0.8, zorder=1)
        ax.text(xs[0], floor * 1.6, "no tuple that late (P = 0, drawn here)", fontsize=7, color="#666666")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(floor / 2, 1.5)
        ax.set_xlabel("latency x (s)")
        ax.set_title(f"({'a' if strategy == 'random' else 'b'}) {strategy} placement")
        ax.legend(fontsize=7.5, title="replicas per operator: bandwidth and network cost\nrelative to the non-replicated min-cost placement", title_fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 0.1))
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("P(latency > x)")
    fig.suptitle(f"Fig. 4: end-to-end latency, {data['simulated_hours']:g} simulated hours, "
                 f"{data['monitored']} monitored servers{_parts_title(data)}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- Fig. 3 --------------------------------------------------------------------------------------

def _binned(t: np.ndarray, lat: np.ndarray, width: float) -> list[dict]:
    if t.size == 0:
        return []
    b = np.floor(t / width).astype(np.int64)
    out = []
    for k in np.unique(b):
        sel = lat[b == k]
        out.append({"t_s": float(k * width), "mean_s": float(sel.mean()), "max_s": float(sel.max()), "n": int(sel.size)})
    return out


def _partitioned(st: Setting) -> dict:
    """The record's ``parallelism`` (every partitioned node: ``{"entry": p, op: p, app: p}``) when the
    setting partitions any, and ``bits`` when it partitions operators by key (else nothing)."""
    return {**({"parallelism": st.partitions()} if st.partitions() else {}),
            **({"bits": st.bits} if st.parallelism else {})}


def _parts_title(data: dict) -> str:
    """A plot title's note of the partitions that ran (``""`` unpartitioned)."""
    return f"; partitioned: {_parts_text(data)}" if data.get("parallelism") else ""


def _row_partitions(st: Setting, placement: Placement, k: int) -> dict:
    """A row's ``partitions``: where the entry and application partitions ran (``{"entry.P":
    servers, "app.P": servers}``, :meth:`Setting.layout`), when there are any."""
    layout = st.layout(placement, k)
    return {"partitions": layout} if layout else {}


def fig3(quick: bool = False, seed: int = 0, out: str | None = None, progress: bool = False,
         parallelism: dict | None = None, bits: int | None = None, simulated_hours: float | None = None) -> dict:
    """Fig. 3: end-to-end latency over time for kmax = 1, 2, 3 (min-cost deployment, Hwang §VI-C).

    The paper ran three engines per server, one per degree of replication, on
    PlanetLab for about 3 hours; here each kmax is a simulated run over the same
    network and inputs. Full scale: 30 servers, 10 monitored, 3 simulated hours.
    Quick: 5 monitored, 20 simulated minutes. Reports mean, standard deviation
    and tail per kmax, and a per-minute series (mean, max) for the plot.
    ``parallelism``: ``{operator: p}`` runs those operators as ``p`` key partitions of
    ``2**bits`` bins, each partition placed with k replicas (:func:`fig1_setting`; issue #41);
    ``"entry": p`` and ``{application: p}`` run entry and application partitions, laid out from
    their node's servers as ``deploy()`` does (each row's ``partitions``).
    ``simulated_hours``, when given, replaces the scale's simulated time (as :func:`fig4`'s).
    """
    monitored, hours = (5, 1 / 3) if quick else (10, 3.0)
    if simulated_hours is not None:
        hours = _hours(simulated_hours)
    st = fig1_setting(30, monitored, hours * 3600.0, seed=seed, parallelism=parallelism, bits=bits)
    ref = run_reference(st.query, st.inputs)
    rows = []
    for k in (1, 2, 3):
        t0 = time.time()
        pl = min_cost(st.problem, k)
        res = _simulate(st, st.plan(pl, k), progress=progress and f"fig3 min-cost kmax={k}")
        _check_exact(st, res, ref)
        arr, lat = res.latencies(st.query.sinks[0])
        order = np.argsort(arr, kind="stable")
        arr, lat = arr[order], lat[order]
        rows.append({"k": k, "tuples": int(lat.size), "mean_s": float(lat.mean()), "std_s": float(lat.std()),
                     "p50_s": float(np.median(lat)), "p99_s": float(np.percentile(lat, 99)),
                     "max_s": float(lat.max()), "series": _binned(arr, lat, 60.0), **_row_partitions(st, pl, k),
                     "wall_s": time.time() - t0})
    data = {"experiment": "fig3", "quick": quick, "seed": seed, "servers": 30, "monitored": monitored,
            **_partitioned(st), "simulated_hours": hours, "rows": rows,
            "paper": "the average as well as the variance of latency decrease as more replicas are deployed"}
    if out:
        _write(out, "fig3", data, [{k: v for k, v in r.items() if k != "series"} for r in rows])
        _plot_fig3(data, os.path.join(out, "fig3.png"))
    return data


def _plot_fig3(data: dict, path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    for r in data["rows"]:
        ser = r["series"]
        ax.plot([x["t_s"] / 3600 for x in ser], [x["max_s"] for x in ser], lw=1,
                label=f"kmax={r['k']} (max per minute; mean {r['mean_s']:.3f} s, std {r['std_s']:.3f} s)")
    ax.set_yscale("log")
    ax.set_xlabel("time (hour)")
    ax.set_ylabel("latency (s)")
    ax.set_title(f"Fig. 3: latency over time, {data['monitored']} monitored of 30 servers, min-cost"
                 f"{_parts_title(data)}")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table_fig3(data: dict) -> str:
    lines = [f"{'kmax':<5} {'tuples':>7} {'mean s':>8} {'std s':>8} {'p99 s':>8} {'max s':>8}"]
    for r in data["rows"]:
        lines.append(f"{r['k']:<5} {r['tuples']:>7} {r['mean_s']:>8.4f} {r['std_s']:>8.4f} {r['p99_s']:>8.4f} {r['max_s']:>8.4f}")
    return "\n".join(lines)


# -- Fig. 2 --------------------------------------------------------------------------------------

#: Fig. 2's manual placement (§VI-B): Unions at WISC (Madison) and Purdue (West Lafayette), the Join at OSU.
FIG2_SITES = {"wisc": "madison", "purdue": "westlafayette", "osu": "columbus"}
FIG2_MONITORED = ("boston", "berkeley", "seattle", "london")


def fig2(quick: bool = False, seed: int = 0, out: str | None = None, progress: bool = False,
         detect_s: float = 2.0) -> dict:
    """Fig. 2: latency over time at the Join's output around a crash of WISC at t = 60 s (Hwang §VI-B).

    Sources on four servers report every 0.5 s; join window 0.5 s. The
    strategies: ``no replication`` (Unions at WISC and Purdue, Join at OSU),
    ``replication`` (this system: second Union replicas at Purdue and WISC),
    ``synchronization`` (primary/backup with determinants: the primary holds
    outputs for one round trip to its backup; downstream fails over
    ``detect_s`` after the crash) and ``deterministic`` (the same failover, each
    replica merging its inputs in timestamp order up to the minimum
    punctuation). The entry points run at Boston and Berkeley (Boston alone
    without replication). Every run's output is checked: complete and equal to
    the reference except ``no replication``, which stops at the crash. Quick
    and full scale are the same 90 s run (it is small).
    """
    q = fig1_query(len(FIG2_MONITORED), window_s=0.5, punctuate_s=0.5)
    names = sorted(set(FIG2_MONITORED) | set(FIG2_SITES.values()))
    from replistream.network import GeoLatencyModel, city

    net = GeoLatencyModel([city(n) for n in names], seed=seed)
    inputs = fig1_inputs(len(FIG2_MONITORED), duration_s=90.0, period_s=0.5, seed=seed)
    sources = {s: FIG2_MONITORED[int(s.rpartition("_")[2])] for s in q.sources}
    wisc, purdue, osu = FIG2_SITES["wisc"], FIG2_SITES["purdue"], FIG2_SITES["osu"]
    single = {"entry": ["boston"], "loads": [wisc], "pings": [purdue], "correlate": [osu], "hot": [osu], "alerts": [osu]}
    double = single | {"entry": ["boston", "berkeley"], "loads": [wisc, purdue], "pings": [purdue, wisc]}
    from replistream.scenario import Scenario

    crash = Scenario.from_dict({"events": [{"at": 60, "action": "kill_server", "server": wisc}]})
    ref = run_reference(q, inputs)
    rows = []
    for label, plan, mode in (("no replication", single, "replication"), ("replication", double, "replication"),
                              ("synchronization", double, "synchronization"),
                              ("deterministic", double, "deterministic")):
        res = Simulator(q, plan, net, sources=sources, scenario=crash, mode=mode, detect_s=detect_s).run(
            inputs, progress=progress and f"fig2 {label}")
        if label != "no replication":
            from replistream.testing import assert_same_output

            assert res.complete, label
            assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
        arr, lat = res.latencies("alerts")
        order = np.argsort(arr, kind="stable")
        arr, lat = arr[order], lat[order]
        before = lat[(arr >= 40) & (arr < 60)]
        after = lat[(arr >= 60) & (arr < 80)]
        late = lat[(arr >= 65) & (arr < 80)]
        rows.append({"strategy": label, "complete": res.complete, "tuples": int(lat.size),
                     "mean_before_s": float(before.mean()) if before.size else None,
                     "mean_after_s": float(late.mean()) if late.size else None,
                     "max_around_crash_s": float(after.max()) if after.size else None,
                     "delivered_after_crash": int(((arr >= 60.5)).sum()),
                     "series": [[float(a), float(b)] for a, b in zip(arr, lat) if 40 <= a <= 80]})
    data = {"experiment": "fig2", "quick": quick, "seed": seed, "crash": {"server": wisc, "at_s": 60},
            "detect_s": detect_s, "rows": rows,
            "paper": {"no replication": "no output after the crash",
                      "replication": "lowest latency; rises after the crash (no more benefit from replication)",
                      "synchronization": "extra delay while primaries wait for backups; failover gap; drops after",
                      "deterministic": "extra delay from sorting (paced by the slowest input); failover gap"}}
    if out:
        _write(out, "fig2", data, [{k: v for k, v in r.items() if k != "series"} for r in rows])
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(9, 4))
        for r in rows:
            s = np.array(r["series"]) if r["series"] else np.zeros((0, 2))
            ax.plot(s[:, 0], s[:, 1], ".-", ms=2, lw=0.8, label=r["strategy"])
        ax.axvline(60, color="k", ls=":", lw=1)
        ax.text(60.5, ax.get_ylim()[1] * 0.9, "crash of WISC")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("latency (s)")
        ax.set_title("Fig. 2: latency at the Join's output around a server crash")
        ax.legend()
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "fig2.png"), dpi=110)
        plt.close(fig)
    return data


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def _table_fig2(data: dict) -> str:
    lines = [f"{'strategy':<16} {'complete':<8} {'mean 40-60 s':>12} {'mean 65-80 s':>12} {'max 60-80 s':>11} "
             f"{'after crash':>11}"]
    for r in data["rows"]:
        lines.append(f"{r['strategy']:<16} {str(r['complete']):<8} {_fmt(r['mean_before_s']):>12} "
                     f"{_fmt(r['mean_after_s']):>12} {_fmt(r['max_around_crash_s']):>11} {r['delivered_after_crash']:>11}")
    return "\n".join(lines)


# -- Table I -------------------------------------------------------------------------------------

def table1(quick: bool = False, seed: int = 0, out: str | None = None, progress: bool = False) -> dict:
    """Table I: per-replica CPU cost by degree of replication (Hwang §VI-D).

    Not simulated: these are the Ray runtime's measured figures
    (:data:`~replistream.sim.cpu.MEASURED_CPU_S`, from ``bench/runtime.py``,
    docs/benchmarks.md), quoted beside the paper's Table I, with the per-copy
    cost fitted from them that the simulator's CPU model uses. ``quick`` and
    ``seed`` change nothing. To measure afresh: ``python bench/runtime.py --only cpu``.
    """
    fit = fit_costs()
    rows = []
    for op in ("union", "filter", "aggregate", "join"):
        ours = MEASURED_CPU_S[op]
        paper = PAPER_TABLE1[op]
        rows.append({"operator": op, "ours_cpu_s": list(ours), "ours_ratio": [x / ours[0] for x in ours],
                     "paper_pct": list(paper), "paper_ratio_vs_k1": [x / paper[1] for x in paper[1:]],
                     "paper_ratio_vs_none": list(PAPER_TABLE1_RATIOS[op]),
                     "fitted_us_per_copy": fit[op], "tuples_in_per_replica": TABLE1_INPUT_TUPLES[op]})
    data = {"experiment": "table1", "source": "docs/benchmarks.md, 'Re-run after the runtime fixes (commit b401f25)': "
            "raw CPU seconds per replica, 20k tuples/s for 10 s, k = 1..4", "rows": rows}
    if out:
        _write(out, "table1", data, [{"operator": r["operator"], **{f"ours_k{k + 1}_s": v for k, v in enumerate(r["ours_cpu_s"])},
                                      **{f"paper_k{k + 1}_pct": v for k, v in enumerate(r["paper_pct"][1:])},
                                      "paper_none_pct": r["paper_pct"][0], "fitted_us_per_copy": r["fitted_us_per_copy"]}
                                     for r in rows])
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        ks = [1, 2, 3, 4]
        for r, c in zip(rows, ["C0", "C1", "C2", "C3"]):
            ax.plot(ks, r["ours_ratio"], "o-", color=c, label=f"{r['operator']} (ours)")
            ax.plot(ks, r["paper_ratio_vs_k1"], "s--", color=c, alpha=0.6, label=f"{r['operator']} (paper)")
        ax.set_xlabel("degree of replication k")
        ax.set_ylabel("CPU per replica relative to k=1")
        ax.set_xticks(ks)
        ax.set_title("Table I: CPU per replica by degree of replication")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "table1.png"), dpi=110)
        plt.close(fig)
    return data


def _table_table1(data: dict) -> str:
    lines = ["operator   ours CPU s per replica, k=1..4 (ratio to k=1)        paper % CPU, none / k=1..4 (ratio to k=1)"]
    for r in data["rows"]:
        ours = "  ".join(f"{v:.2f} ({q:.2f}x)" for v, q in zip(r["ours_cpu_s"], r["ours_ratio"]))
        paper = f"{r['paper_pct'][0]} / " + "  ".join(f"{v} ({q:.2f}x)" for v, q in zip(r["paper_pct"][1:], r["paper_ratio_vs_k1"]))
        lines.append(f"{r['operator']:<10} {ours:<52} {paper}")
    return "\n".join(lines)


# -- live rescaling (issue #41) ------------------------------------------------------------------

#: The strategies :func:`rescale` compares, and how each cuts the moving bins (as on Ray).
RESCALE_STRATEGIES = {"fluid": {}, "batched": {"bins_per_step": 16}, "all-at-once": {}}


def rescale(quick: bool = False, seed: int = 0, out: str | None = None, progress: bool = False,
            state_row_us: float = 20.0) -> dict:
    """Live rescaling in simulated time (issue #41; Megaphone, Hoffmann et al. 2019, §5): a keyed
    tumbling count (one-second windows; 2,000 keys quick, 20,000 full, so about that many open
    windows: the state that moves) over six built-in cities (:func:`~replistream.network.default_servers`,
    a :class:`~replistream.network.GeoLatencyModel`), k = 2, 2^8 bins, rescaled 1 -> 2 at a third
    of the run and 2 -> 4 at two thirds, once per strategy of :data:`RESCALE_STRATEGIES` (step gap
    1 ms of event time, as on Ray), and once without a rescale (the baseline). The entry points
    and partition 0 run on the first two cities, partitions 1 and 3 on the next two, partition 2
    on the last two (the bins' state crosses the wide-area network). The CPU model is the measured
    default plus ``state_row_us`` per row of state moved at the giver and again at each taker:
    an assumption, not a measurement (``assumptions`` in the data).

    Per strategy and move: the simulated duration (from the rescale to every working replica
    having given and installed every step), the latency of the outputs arriving from the start to
    one window past the end (max, p99, median), the baseline's max over the same span, the max over
    as long a span right after it (the new partitions settled: what the placement costs, not the
    move), and whether the run equals the reference run. ``quick``: 12 simulated seconds at 1,000 tuples/s; full: 60 s
    at 5,000 tuples/s.

    >>> list(RESCALE_STRATEGIES), RESCALE_STRATEGIES["batched"]
    (['fluid', 'batched', 'all-at-once'], {'bins_per_step': 16})
    """
    from replistream import Query
    from replistream.network import GeoLatencyModel
    from replistream.sources import Rescale
    from replistream.testing import assert_same_output, chunked

    from .cpu import CpuModel

    seconds, rate, keys = (12.0, 1_000, 2_000) if quick else (60.0, 5_000, 20_000)
    window_us = 1_000_000
    q = Query(name="keyed_count")
    src = q.source("s", {"k": "i8"}, punctuate_every=20)
    src.window(size=window_us, by="k", name="per_key").sink("out")
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    step_us = int(1e6 / rate)
    recs = [{"ts": i * step_us, "k": int(k)} for i, k in enumerate(rng.integers(0, keys, n))]
    data = {"s": chunked(recs, 20)}
    ref = run_reference(q, data).outputs["out"]
    cities = default_servers(6)
    names = [c.name for c in cities]
    net = GeoLatencyModel(cities, seed=seed)
    plan = {"entry": names[:2], "per_key": names[:2], "per_key.1": names[2:4], "per_key.2": names[4:6],
            "per_key.3": names[2:4], "out": [names[5]]}
    cpu = CpuModel(per_state_row_us=state_row_us)
    at = [seconds / 3, 2 * seconds / 3]
    after_s = window_us / 1e6

    def simulate(label, rescales):
        sim = Simulator(q, plan, net, cpu=cpu, parallelism={"per_key": 1}, bits=8, rescales=rescales,
                        rescale_after_s=after_s)
        res = sim.run(data, progress=f"rescale {label}" if progress else False, horizon_s=seconds)
        try:
            assert_same_output(ref, res.outputs["out"])
            exact = True
        except AssertionError:
            exact = False
        return res, exact

    base, base_exact = simulate("baseline", [])
    b_arr = base.arrivals["out"]
    b_lat = latency_s(b_arr, base.outputs["out"]["ts"], base.ts0)
    rows = []
    for strategy, opts in RESCALE_STRATEGIES.items():
        res, exact = simulate(strategy, [(at[0], Rescale("per_key", 2, strategy, **opts)),
                                         (at[1], Rescale("per_key", 4, strategy, **opts))])
        arr = res.arrivals["out"]
        lat = latency_s(arr, res.outputs["out"]["ts"], res.ts0)
        for rec in res.stats["rescales"]:
            a, b = rec["latency_window_s"] if rec.get("latency_window_s") else (rec["start_s"], rec["start_s"])
            span = (b_arr >= a) & (b_arr <= b)
            later = (arr > b) & (arr <= 2 * b - a)  # as long a span right after: the new placement, settled
            rows.append({"strategy": strategy, "move": f"{rec['from']}->{rec['to']}", "steps": rec["steps"],
                         "bins_moved": rec["bins_moved"], "start_s": rec["start_s"], "duration_s": rec["duration_s"],
                         "max_s": rec.get("latency_during_max_s"), "p99_s": rec.get("latency_during_p99_s"),
                         "median_s": rec.get("latency_during_median_s"), "outputs": rec.get("outputs_during", 0),
                         "baseline_max_s": float(b_lat[span].max()) if span.any() else None,
                         "after_max_s": float(lat[later].max()) if later.any() else None, "exact": exact})
    data_out = {"experiment": "rescale", "seconds": seconds, "rate": rate, "keys": keys, "bits": 8, "k": 2,
                "window_s": window_us / 1e6, "baseline_exact": base_exact, "rows": rows,
                "assumptions": {"state_row_us": state_row_us,
                                "note": "CPU per row of state moved, at the giver and at each taker: not measured"}}
    if out:
        _write(out, "rescale", data_out, rows)
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        names_ = [f"{r['strategy']} {r['move']}" for r in rows]
        ax.bar(range(len(rows)), [r["max_s"] or 0.0 for r in rows], color="C0", label="max latency during")
        ax.plot(range(len(rows)), [r["baseline_max_s"] or 0.0 for r in rows], "k_", markersize=20,
                label="no rescale, same span")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names_, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("latency (simulated s)")
        ax.set_title("Live rescaling in the simulator")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "rescale.png"), dpi=110)
        plt.close(fig)
    return data_out


def _table_rescale(data: dict) -> str:
    lines = [f"{'strategy':<12} {'move':<5} {'steps':>5} {'duration s':>10} {'max s':>7} {'p99 s':>7} "
             f"{'after max s':>11} {'no-rescale max s':>16}  exact"]
    for r in data["rows"]:
        lines.append(f"{r['strategy']:<12} {r['move']:<5} {r['steps']:>5} {_fmt(r['duration_s']):>10} "
                     f"{_fmt(r['max_s']):>7} {_fmt(r['p99_s']):>7} {_fmt(r.get('after_max_s')):>11} "
                     f"{_fmt(r['baseline_max_s']):>16}  {r['exact']}")
    return "\n".join(lines)


def _verdict_rescale(data: dict) -> str:
    """One line: fluid's max latency during each move against all-at-once's (Megaphone: lower)."""
    by = {(r["strategy"], r["move"]): r for r in data["rows"]}
    moves = [m for s, m in by if s == "fluid" and ("all-at-once", m) in by]
    exact = all(r["exact"] for r in data["rows"])
    parts, lower = [], True
    for m in moves:
        f, a = by[("fluid", m)]["max_s"], by[("all-at-once", m)]["max_s"]
        parts.append(f"{m} {_fmt(f)} s against {_fmt(a)} s")
        lower = lower and f is not None and a is not None and f < a
    return (f"rescale: max latency during the move, fluid against all-at-once: {'; '.join(parts) or 'none ran'}"
            f"{'' if exact else ' (NOT EXACT)'}; Megaphone: fluid lower: {'holds' if moves and lower else 'does not hold'}")


# -- Fig. 5 --------------------------------------------------------------------------------------

#: Fig. 5's latency guarantee (s): what min-cost achieved in Fig. 4(b) ("always smaller than 1 second").
FIG5_GUARANTEE_S = 1.0
#: Epoch of the batched engine Fig. 5's revival runs go in (virtual s; they also stop every 10 s
#: for the coordinator, or run up to :data:`FIG5_LOOKAHEAD_S` ahead).
FIG5_BATCH_S = 600.0
#: Epoch of the runs without a coordinator (static, GC alone): a batched epoch costs about 65 ms
#: whatever its length, so longer epochs are cheaper (24 h, kmax 3: 22.6 s of CPU at 600 s,
#: 11.2 s at 3,600 s, 13.7 s at 7,200 s). Latencies agree to 1e-10 s with 600 s epochs; the
#: filters' weights differ in the last digits (ties between copies broken by rounding).
FIG5_PLAIN_BATCH_S = 3600.0


class GuaranteeWatch:
    """``abort`` for :meth:`Simulator.run`: stops a run as soon as it is certain to break a
    latency guarantee, so that a failing trial of Fig. 5 costs only the time to its first
    breach. ``metric`` ``"max"``: a tuple later than ``guarantee_s``; ``"p99"``: more tuples
    later than ``guarantee_s`` than the 99th percentile of ``n_expected`` latencies (numpy's
    linear interpolation) can hold, i.e. at least ``n - floor(0.99 (n - 1))``. A run whose output
    differs from the reference fails anyway, so a count taken against the reference's size is
    sound for every run that could pass.

    >>> w = GuaranteeWatch("p99", 1.0, n_expected=1000)
    >>> w.allowed
    10
    >>> w.add(np.array([2.0] * 10)), w.add(np.array([3.0]))
    (None, 'p99 latency above 1 s: 11 of 1,000 expected tuples later than 1 s')
    """

    def __init__(self, metric: str, guarantee_s: float, n_expected: int):
        if metric not in FIG5_METRICS:
            raise ValueError(f"metric must be one of {', '.join(FIG5_METRICS)}, got {metric!r}")
        self.metric, self.g, self.n = metric, float(guarantee_s), int(n_expected)
        self.allowed = self.n - math.floor(0.99 * (self.n - 1)) - 1 if metric == "p99" else 0
        self.over = 0
        self.max_s = 0.0
        self._seen: dict[str, int] = {}

    def add(self, lat: np.ndarray) -> str | None:
        """Count latencies ``lat`` (s); the reason the guarantee is broken, or None."""
        if len(lat):
            self.max_s = max(self.max_s, float(lat.max()))
            self.over += int((lat > self.g).sum())
        if self.metric == "max" and self.over:
            return f"maximum latency above {self.g:g} s: {self.max_s:.3f} s"
        if self.metric == "p99" and self.over > self.allowed:
            return (f"p99 latency above {self.g:g} s: {self.over:,} of {self.n:,} expected tuples later "
                    f"than {self.g:g} s")
        return None

    def __call__(self, sim) -> str | None:
        """The latencies the applications received since the last call (Simulator.run's ``abort``)."""
        why = None
        for app in sim.query.sinks:
            lat, self._seen[app] = sim.groups[app][0].recorder.latencies_since(self._seen.get(app, 0), sim.ts0)
            why = self.add(lat) or why
        return why


#: Readings per input chunk in Fig. 5's runs (an hour at 10 s; only speed changes, see :func:`fig1_setting`).
FIG5_CHUNK = 360
#: Targets theta tried, as fractions of the static min-cost network cost, most generous first.
FIG5_THETAS = (0.8, 0.6, 0.45, 0.35, 0.25, 0.18, 0.12, 0.08, 0.05, 0.03)


def _snapshot(st: Setting, plan: dict, weights=None, theta=math.inf):
    from replistream.gc import snapshot_from_plan

    idx = st.problem.index
    lat = st.problem.latency
    return snapshot_from_plan(st.query, plan, rates=st.rates, latency=lambda a, b: float(lat[idx[a], idx[b]]),
                              weights=weights, kmin=1, theta=theta)


def _cost(st: Setting, snap) -> float:
    """Network cost of a snapshot in the placement problem's units (bytes/s x ms): its live
    stream replicas plus each source's stream to every entry replica that still feeds something."""
    idx, lat = st.problem.index, st.problem.latency
    live_entries = {x.src for x in snap.streams if x.live and x.src.startswith("entry#")}
    servers = {r.label: r.server for r in snap.replicas}
    src = sum(st.rates[s] * float(lat[idx[a], idx[servers[e]]]) for s, a in st.sources.items() for e in live_entries)
    return snap.total_cost() + src


#: Fig. 5's revival damping (§V-C, :class:`replistream.gc.RevivalDamper`): a delay above the 0.5 s
#: threshold must persist 2 coordinator periods (10 s each) and only one below 0.25 s clears it. No
#: hold: with ``hold_s=600`` the collector reached theta by discarding other groups instead, and at
#: 6 simulated hours, kmax 3, target 8% that broke the 1 s maximum (0.341 s -> 111-131 s;
#: docs/experiments.md, Fig. 5, "Damped revival").
FIG5_DAMPING = {"persist": 2, "clear_s": 0.25, "hold_s": 0.0}
#: Revival's threshold (s) on the delay a replica observes, in Fig. 5's runs.
FIG5_REVIVAL_THRESHOLD_S = 0.5


def _placer(st: Setting, sim):
    """``place(operator, snapshot, hindered)`` for revival's new replicas in the simulator: the
    server nearest (latency to the hindered replica's server plus from the nearest live upstream
    replica, or the nearest source for entry points) among those never used by ``operator``."""
    idx, lat = st.problem.index, st.problem.latency
    names = sorted(idx)

    def place(op: str, snap, h: str):
        used = set(sim.plan.get(op, []))
        hs = snap.replica(h).server
        ups = {snap.replica(x.src).server for r in snap.replicas_of(op) for x in snap.in_streams(r.label)}
        if op == "entry" or not ups:
            ups = set(st.sources.values())
        best = None
        for c in names:
            if c in used:
                continue
            key = (float(lat[idx[c], idx[hs]]) + min(float(lat[idx[u], idx[c]]) for u in ups), c)
            best = key if best is None or key < best else best
        return None if best is None else best[1]

    return place


#: Look-ahead of Fig. 5's revival runs (virtual s): how far the batched engine may run between two
#: coordinator calls when :func:`replistream.sim.lookahead.delay_bounds` shows no replica can observe
#: a delay above the threshold (None: stop at every call, as before).
FIG5_LOOKAHEAD_S = 600.0
#: A look-ahead starts only this long (virtual s) after the last change of the live stream
#: replicas, and its bound covers the link delays from this long before it.
LOOKAHEAD_SETTLE_S = 60.0
#: ... and only when the bound is at most this share of the revival threshold.
LOOKAHEAD_MARGIN = 1.0


def _gc_run(st: Setting, plan: dict, snap, ref, revival: bool, progress: bool | str, period_s: float = 10.0,
            gc_period_s: float = 300.0, threshold_s: float = FIG5_REVIVAL_THRESHOLD_S, damping: dict | None = None,
            create: bool = True, lookahead_s: float | None = FIG5_LOOKAHEAD_S, _fallback: bool = True,
            log: Callable[[float], None] | None = None, watch: Callable[[], GuaranteeWatch] | None = None,
            silence_s: float = 60.0) -> dict:
    """Simulate ``plan`` with only ``snap``'s live stream replicas; with ``revival``, a coordinator
    every ``period_s`` revives for replicas observing input delays above ``threshold_s``
    (:func:`replistream.gc.plan_revival`, damped by a :class:`replistream.gc.RevivalDamper`
    with ``damping``'s ``persist``, ``clear_s``, ``hold_s``; None: undamped) and every
    ``gc_period_s`` runs Algorithm 6 down to theta when the cost exceeds theta, with the
    filters' current weights, never discarding what a revival brought back within its hold
    (§V-B, §V-C, Hwang). With ``create``, decisions that need a new replica start it
    (:meth:`Simulator.add_replica` on the server :func:`_placer` picks); without, they and
    the events planned after them are skipped. Returns the latency, the time-averaged
    network cost and what was done (counts, the replicas that triggered, the streams revived).

    ``lookahead_s``: revival decided incrementally inside the batched engine. At a call where
    the live stream replicas have not changed for :data:`LOOKAHEAD_SETTLE_S`, every fed replica
    had input in the last 20 s and :func:`replistream.sim.lookahead.delay_bounds` bounds every
    replica's observable delay by :data:`LOOKAHEAD_MARGIN` x ``threshold_s`` up to ``t +
    lookahead_s`` (up to the next collection if the cost is above theta, never within the last
    minute of input), the engine runs that far in one go and replays the calls in between from
    its records. The decisions are those of a run stopped every ``period_s``: a replayed call that
    would act stops the run (:class:`~replistream.sim.batch.LookaheadMiss`) and it is run again
    without look-ahead (counted in ``lookahead_misses``). None: stop at every call. ``log(t)``
    is called at every coordinator call (progress of long runs, bench/sim.py --fig5).

    ``silence_s``: a port with no new tuple for longer observes the silence beyond it as a
    delay (:meth:`Simulator.input_delays`): the detection delay of a cut path.

    ``watch``: makes a :class:`GuaranteeWatch` that stops the run once the guarantee is broken
    for sure (``aborted`` says why and when; the result is then not exact, and ``max_s`` and
    ``p99_s`` are those of the tuples delivered so far).

    A run that completes with an output other than the reference's is not a failed trial but a
    broken guarantee of the system: ``inexact`` holds what differs (lost, extra, duplicated
    tuples) and ``exact`` is False; Fig. 5 stops on it."""
    from collections import Counter

    from replistream.sim.batch import LookaheadMiss

    if revival and lookahead_s is not None and _fallback:
        try:
            return _gc_run(st, plan, snap, ref, revival, progress, period_s, gc_period_s, threshold_s, damping,
                           create, lookahead_s, _fallback=False, log=log, watch=watch, silence_s=silence_s)
        except LookaheadMiss:
            r = _gc_run(st, plan, snap, ref, revival, progress, period_s, gc_period_s, threshold_s, damping,
                        create, None, log=log, watch=watch, silence_s=silence_s)
            r["lookahead_misses"] = 1
            return r

    from replistream.gc import RevivalDamper, apply_revival, collect_garbage, plan_revival

    damp = dict(persist=1, clear_s=threshold_s, hold_s=0.0) if damping is None else dict(damping)
    damper = RevivalDamper(threshold_s=threshold_s, **damp)
    state = {"snap": snap, "cost_area": 0.0, "last_t": 0.0, "revivals": 0, "discards": 0, "last_gc": 0.0, "changed": 0.0,
             "skipped": 0, "created": 0, "held_blocked": 0, "triggers": Counter(), "revived": Counter(),
             "actions": Counter(), "max_trigger_s": 0.0, "over_threshold": 0}
    idx, latm = st.problem.index, st.problem.latency
    latency = lambda a, b: float(latm[idx[a], idx[b]])  # noqa: E731

    def coordinator(sim, t):
        if log is not None:
            log(t)
        s = state["snap"]
        state["cost_area"] += _cost(st, s) * (t - state["last_t"])
        state["last_t"] = t
        delays = sim.input_delays(t, silence_s=silence_s)
        state["over_threshold"] += sum(d > threshold_s for d in delays.values())
        events = []
        for e in plan_revival(s, damper.observe(delays), threshold_s=threshold_s,
                              place=place if create else None, latency=latency):
            if e.action == "none":
                continue
            if e.new_replicas:
                if not create:  # later events may build on it
                    state["skipped"] += 1
                    break
                labels = [sim.add_replica(r.operator, r.server) for r in e.new_replicas]
                if labels != [r.label for r in e.new_replicas]:
                    raise RuntimeError(f"revival planned {[r.label for r in e.new_replicas]}, the simulator "
                                       f"created {labels}")
                state["created"] += len(labels)
            events.append(e)
            state["triggers"][e.replica] += 1
            state["actions"][e.action] += 1
            state["revived"].update(list(e.revive_streams) + [x.id for x in e.new_streams])
            state["max_trigger_s"] = max(state["max_trigger_s"], float(delays.get(e.replica, 0.0)))
        if events:
            s = apply_revival(s, events)
            damper.fired(t, events)
            state["revivals"] += len(events)
        if t - state["last_gc"] >= gc_period_s:
            state["last_gc"] = t
            w = {k: v for k, v in sim.weights().items() if s.has_stream(k)}  # not a new replica's unused links
            g = collect_garbage(s.with_weights(w), keep=damper.held(t))  # down to theta
            if "held" in g.stopped:
                state["held_blocked"] += 1
            s = g.snapshot if g.steps else s
            state["discards"] += g.steps
        if s is not state["snap"]:
            state["snap"] = s
            state["changed"] = t
            sim.apply_snapshot(s)

    from .lookahead import delay_bounds

    # no look-ahead over the input's end: input_end() must stay unknown (inf) at every replayed call
    last_input = st.duration_s - 60.0

    def ahead(sim, t):
        s = state["snap"]
        if t - state["changed"] < LOOKAHEAD_SETTLE_S:
            return None
        h = t + lookahead_s
        if s.total_cost() > s.theta:  # the next collection acts: stop there
            h = min(h, state["last_gc"] + gc_period_s)
        h = min(h, last_input)
        if h < t + 2 * period_s:
            return None
        fed = {lk.receiver.label for lk in sim.links if lk.live and lk.sender.alive}
        for g in sim.groups.values():
            for r in g:
                if r.alive and r.core is not None and r.label in fed and (
                        not r.last_in or t - min(r.last_in) > min(20.0, silence_s / 3)):
                    return None
        while h >= t + 2 * period_s:  # the longest of h, then 1/2, 1/4 ... as far ahead whose bound holds
            b = delay_bounds(sim, t - LOOKAHEAD_SETTLE_S, h)
            if max(b.values(), default=0.0) <= LOOKAHEAD_MARGIN * threshold_s:
                return h
            h = t + period_s * math.floor((h - t) / (2 * period_s))
        return None

    coord = None
    if revival:
        coord = (period_s, coordinator) if lookahead_s is None else (period_s, coordinator, ahead)
    sim = Simulator(st.query, plan, st.network, sources=st.sources,
                    coordinator=coord, retain=revival, batch_s=FIG5_BATCH_S if revival else FIG5_PLAIN_BATCH_S)
    place = _placer(st, sim)
    sim.apply_snapshot(snap)
    res = sim.run(st.inputs, progress=progress, abort=watch() if watch is not None else None)
    ok, inexact = res.complete and not sim.aborted, None
    if ok:
        try:
            _check_exact(st, res, ref)
        except AssertionError as e:  # a simulator or revival bug: the caller stops (_fig5_row)
            ok, inexact = False, str(e)
    lat = np.concatenate([res.latencies(a)[1] for a in st.query.sinks])
    if revival:
        end = res.end_time
        state["cost_area"] += _cost(st, state["snap"]) * max(0.0, end - state["last_t"])
        cost = state["cost_area"] / end if end > 0 else _cost(st, snap)
    else:
        cost = _cost(st, snap)
    return {"exact": ok, "max_s": float(lat.max()) if lat.size else math.inf,
            "p99_s": float(np.percentile(lat, 99)) if lat.size else math.inf, "cost": cost,
            "live_streams": sum(1 for x in state["snap"].streams if x.live), "revivals": state["revivals"],
            "discards": state["discards"], "skipped_new_replicas": state["skipped"],
            "created_replicas": state["created"], "gc_stopped_by_hold": state["held_blocked"],
            "observations_over_threshold": state["over_threshold"], "max_trigger_delay_s": state["max_trigger_s"],
            "actions": dict(state["actions"]), "top_triggers": state["triggers"].most_common(5),
            "top_revived_streams": state["revived"].most_common(5),
            "handovers": sum(e["event"] == "handover" for e in res.events),
            "lookahead_epochs": sim._batch.lookahead_epochs if sim._batch is not None else 0,
            "lookahead_calls": sim._batch.lookahead_calls if sim._batch is not None else 0,
            "lookahead_misses": 0, "aborted": sim.aborted, "inexact": inexact}


def _lowest_passing(n: int, trial: Callable[[int], bool]) -> int | None:
    """Binary search over targets ``0..n-1`` (most generous first) for the last one whose
    ``trial`` passes, assuming that once a target fails every lower one fails too (Algorithm 6
    discards a superset at a lower target, and a duplicate filter fed by fewer paths is never
    faster). ``None`` when even the first fails. Takes about log2(n) + 1 trials instead of up to n.

    >>> _lowest_passing(8, lambda i: i <= 5), _lowest_passing(8, lambda i: False), _lowest_passing(8, lambda i: True)
    (5, None, 7)
    """
    lo, hi, best = 0, n - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if trial(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _fig5_scale(quick: bool, hours: float | None = None, kmax=None) -> tuple[int, float, tuple[int, ...]]:
    """(monitored servers, simulated hours, kmax values) of Fig. 5 at quick or full scale;
    ``hours`` and ``kmax`` override the scale's.

    >>> _fig5_scale(True), _fig5_scale(False, hours=4, kmax=[3])
    ((5, 0.08333333333333333, (2, 3)), (10, 4.0, (3,)))
    """
    monitored, h, ks = (5, 1 / 12, (2, 3)) if quick else (10, 24.0, (2, 3, 4, 5))
    return monitored, float(hours) if hours is not None else h, tuple(kmax) if kmax is not None else ks


#: What Fig. 5's guarantee bounds: the maximum latency (default) or the 99th percentile.
FIG5_METRICS = {"max": "max_s", "p99": "p99_s"}


class TrialCache:
    """Results of Fig. 5's simulated runs kept on disk, one JSON file per run, named by a digest
    of the experiment's parameters, the kmax and what the run is (static; GC alone or GC +
    revival, its target and the live stream replicas it starts with), so that a row stopped
    halfway (a month row takes hours) goes on from its last finished run. A file is written
    whole (to a temporary name, then renamed): a run cut short leaves nothing. After a change
    of the simulator, delete the directory: the digest does not cover the code. Fig. 5 leaves
    the guarantee's metric out of the parameters: a run is the same under either, only where a
    watch stops it differs (:func:`_reusable`).

    >>> import tempfile
    >>> c = TrialCache(tempfile.mkdtemp(), {"seed": 0, "k": 3})
    >>> c.get({"run": "static"}) is None
    True
    >>> c.put({"run": "static"}, {"max_s": 0.2}); c.get({"run": "static"})
    {'max_s': 0.2}
    >>> TrialCache(c.path, {"seed": 1, "k": 3}).get({"run": "static"}) is None   # other parameters
    True
    """

    def __init__(self, path: str, params: dict, reuse: bool = True):
        self.path, self.params, self.reuse = path, params, reuse
        os.makedirs(path, exist_ok=True)

    def _file(self, key: dict) -> str:
        text = json.dumps({"params": self.params, "key": key}, sort_keys=True, default=jsonable)
        return os.path.join(self.path, hashlib.sha256(text.encode()).hexdigest()[:24] + ".json")

    def get(self, key: dict) -> dict | None:
        """The result stored under ``key``, or None (always None unless ``reuse``)."""
        path = self._file(key)
        if not self.reuse or not os.path.exists(path):
            return None
        with open(path) as fh:
            return json.load(fh)["result"]

    def put(self, key: dict, result: dict) -> None:
        """Store ``result`` under ``key``."""
        path = self._file(key)
        with open(path + ".tmp", "w") as fh:
            json.dump({"params": self.params, "key": key, "result": result}, fh, default=jsonable)
        os.replace(path + ".tmp", path)


def _reusable(result: dict, metric: str) -> bool:
    """Whether a stored run of Fig. 5 answers ``metric``'s question. A run its
    :class:`GuaranteeWatch` did not stop is the same whatever the metric, so it answers both. A
    run stopped for one metric answers that one, and the maximum when it broke the 99th
    percentile (a p99 over the guarantee means a maximum over it); a run stopped at a maximum
    over the guarantee says nothing of the p99.

    >>> _reusable({"aborted": None, "watch": "max"}, "p99"), _reusable({"aborted": "p99 ...", "watch": "p99"}, "max")
    (True, True)
    >>> _reusable({"aborted": "maximum ...", "watch": "max"}, "p99")
    False
    """
    watched = result.get("watch")
    return not result.get("aborted") or watched == metric or (watched == "p99" and metric == "max")


def _fig5_row(k: int, quick: bool, seed: int, progress: bool = False, hours: float | None = None,
              damping: bool = True, create: bool = True, metric: str = "max", trials_dir: str | None = None,
              reuse: bool = True, thetas=FIG5_THETAS, volatility: float = 1.0) -> dict:
    """One kmax of Fig. 5 (static, GC, GC + revival); runs on its own, so rows can run in
    parallel processes. The setting is rebuilt from its seed, identically in every process.
    ``thetas``: the targets, most generous first (:data:`FIG5_THETAS`); ``volatility``: the
    network's rates of spikes and outages, as multiples of the model's (:func:`fig1_setting`);
    ``damping``: revival damped with :data:`FIG5_DAMPING` (False: as before, undamped);
    ``create``: revival may start new replicas; ``metric``: a key of :data:`FIG5_METRICS`;
    ``trials_dir``: each simulated run's result is kept there (:class:`TrialCache`) and, with
    ``reuse``, taken from there when a call with the same parameters stored it (``reused`` in
    ``tried``), under either metric where the run answers this one (:func:`_reusable`)."""
    from replistream.gc import collect_garbage

    monitored, hours, _ = _fig5_scale(quick, hours)
    mkey = FIG5_METRICS[metric]
    t0, c0 = time.time(), time.process_time()
    st = fig1_setting(30, monitored, hours * 3600.0, seed=seed, chunk=FIG5_CHUNK, volatility=volatility)
    # a run depends on its own target (in its key), not on the grid or the metric (_reusable)
    run_params = {x: v for x, v in _fig5_params(quick, seed, hours, damping, create, volatility=volatility).items()
                  if x not in ("metric", "thetas")}
    cache = TrialCache(trials_dir, {**run_params, "k": k}, reuse=reuse) if trials_dir else None
    ref = functools.cache(lambda: run_reference(st.query, st.inputs))  # made only when a run needs it

    base = st.base_placement()
    base_cost = base.network_cost
    assert math.isclose(_cost(st, _snapshot(st, base.plan())), base_cost, rel_tol=1e-9)
    plan = min_cost(st.problem, k).plan()
    static_run = cache.get({"run": "static"}) if cache else None
    if static_run is None:
        w0, p0 = time.time(), time.process_time()
        sim = Simulator(st.query, plan, st.network, sources=st.sources, batch_s=FIG5_PLAIN_BATCH_S)
        res = sim.run(st.inputs, progress=progress and f"fig5 kmax={k} static min-cost")
        _check_exact(st, res, ref())
        lat = np.concatenate([res.latencies(a)[1] for a in st.query.sinks])
        static_run = {"weights": sim.weights(), "max_s": float(lat.max()),
                      "n_out": sum(len(ref().outputs[a]) for a in st.query.sinks),
                      "wall_s": time.time() - w0, "cpu_s": time.process_time() - p0}
        if cache:
            cache.put({"run": "static"}, static_run)
    n_out = static_run["n_out"]
    snap0 = _snapshot(st, plan, weights=static_run["weights"])
    static = snap0.total_cost()  # Algorithm 6's theta is about the streams it can discard
    row = {"k": k, "static_cost": _cost(st, snap0) / base_cost, "static_max_s": static_run["max_s"],
           "static_streams": len(snap0.streams), "static_wall_s": static_run["wall_s"],
           "static_cpu_s": static_run["cpu_s"]}
    tried: list[dict] = []
    done: dict = {}  # a GC target Algorithm 6 cannot reach leaves the snapshot of the one above: not re-run
    results: dict = {}  # (mode, target index) -> result

    def trial(mode: str, i: int) -> bool:
        f = thetas[i]
        g = collect_garbage(snap0.evolve(theta=f * static))
        live = frozenset(x.id for x in g.snapshot.streams if x.live)
        key = (mode, f if mode == "gc+revival" else None, live)  # revival's GC steps aim at theta
        if key not in done:
            ckey = {"run": mode, "theta": key[1], "live": sorted(live)}
            got = cache.get(ckey) if cache else None
            if got is not None and _reusable(got, metric):
                done[key] = {**got, "reused": True}
            else:
                snap = g.snapshot.evolve(theta=f * static) if mode == "gc+revival" else g.snapshot
                w0, p0 = time.time(), time.process_time()
                done[key] = _gc_run(st, plan, snap, ref(), revival=mode == "gc+revival",
                                    progress=progress and f"fig5 kmax={k} {mode} theta={f:g}",
                                    damping=FIG5_DAMPING if damping else None, create=create,
                                    watch=lambda: GuaranteeWatch(metric, FIG5_GUARANTEE_S, n_out))
                done[key].update(wall_s=time.time() - w0, cpu_s=time.process_time() - p0, watch=metric)
                if cache:
                    cache.put(ckey, done[key])
            tried.append({"theta": f, "mode": mode, **done[key]})
        r = done[key]
        if r.get("inexact"):
            raise RuntimeError(f"fig5 kmax={k} {mode} theta={f:g}: the run completed with an output other than the "
                               f"reference run's (kept in {trials_dir}): {r['inexact']}")
        results[(mode, i)] = r
        return bool(r["exact"] and r[mkey] <= FIG5_GUARANTEE_S)

    gi = _lowest_passing(len(thetas), lambda i: trial("gc", i))
    start = gi if gi is not None else 0
    ri = _lowest_passing(len(thetas) - start, lambda j: trial("gc+revival", start + j))
    ri = None if ri is None else start + ri
    gc_best = results[("gc", gi)] if gi is not None else None
    rv_best = results[("gc+revival", ri)] if ri is not None else None
    gc_cost = gc_best["cost"] if gc_best else _cost(st, snap0)  # nothing kept: the static deployment's
    row.update({
        "gc_theta": thetas[gi] if gi is not None else None,
        "gc_cost": gc_cost / base_cost,
        "gc_max_s": gc_best["max_s"] if gc_best else row["static_max_s"],
        "gc_p99_s": gc_best["p99_s"] if gc_best else None, "metric": metric,
        "gc_streams": gc_best["live_streams"] if gc_best else len(snap0.streams),
        "revival_theta": thetas[ri] if ri is not None else None,
        "revival_cost": (rv_best["cost"] if rv_best else gc_cost) / base_cost,
        "revival_max_s": rv_best["max_s"] if rv_best else None,
        "revival_p99_s": rv_best["p99_s"] if rv_best else None,
        "revivals": rv_best["revivals"] if rv_best else 0, "discards": rv_best["discards"] if rv_best else 0,
        "created_replicas": rv_best["created_replicas"] if rv_best else 0, "tried": tried,
        "wall_s": time.time() - t0, "cpu_s": time.process_time() - c0})
    return row


def _fig5_params(quick: bool, seed: int, hours: float | None = None, damping: bool = True, create: bool = True,
                 metric: str = "max", thetas=FIG5_THETAS, volatility: float = 1.0) -> dict:
    monitored, hours, _ = _fig5_scale(quick, hours)
    params = {"quick": quick, "seed": seed, "monitored": monitored, "simulated_hours": hours,
              "guarantee_s": FIG5_GUARANTEE_S, "metric": metric, "thetas": list(thetas), "batch_s": FIG5_BATCH_S,
              "plain_batch_s": FIG5_PLAIN_BATCH_S,
              "revival_threshold_s": FIG5_REVIVAL_THRESHOLD_S, "damping": dict(FIG5_DAMPING) if damping else None,
              "create_replicas": create}
    if volatility != 1.0:  # the model's own rates leave no key: runs made before the option stay valid
        params["volatility"] = float(volatility)
    return params


def fig5(quick: bool = False, seed: int = 0, out: str | None = None, progress: bool = False,
         jobs: int | None = None, resume: bool = False, hours: float | None = None, kmax=None,
         damping: bool = True, create: bool = True, metric: str = "max", trials: str | None = None,
         thetas=None, volatility: float = 1.0) -> dict:
    """Fig. 5: network cost of static min-cost, with garbage collection, and with garbage
    collection and revival, kmax = 2..5, at the same latency guarantee (Hwang §VI-F).

    For each kmax: (1) static: Algorithm 5's placement, simulated; its duplicate
    filters' weights give replica utilities (§V-B). (2) GC: Algorithm 6
    (:func:`replistream.gc.collect_garbage`) to targets theta of decreasing
    cost (:data:`FIG5_THETAS`); each result is simulated with the discarded stream
    replicas off, and the cheapest that keeps every latency under
    :data:`FIG5_GUARANTEE_S` and the output exact is kept (found by binary search over
    the targets, :func:`_lowest_passing`). (3) GC + revival: the same search over the
    targets from GC's down, simulated with revival (§V-C: replicas observing
    input delays above 0.5 s revive discarded streams and replicas, or get new ones
    (``create``); stateful ones are handed over from a live peer; with ``damping``
    (:data:`FIG5_DAMPING`) only a delay that persists two periods revives and what is
    revived is held from the collector for 10 minutes) and Algorithm 6 down to theta every
    5 minutes, as the runtime does; the cost is averaged over time. ``metric`` ``"p99"``
    bounds the 99th percentile of latency instead of the maximum. Costs are the placement model's (rate in bytes/s x latency, every stream
    replica, the sources' streams to live entry points included), relative to the
    non-replicated placement's, as in Fig. 4; theta applies to the discardable part.
    Full scale: 10 monitored servers, 24 simulated hours; quick: 5 monitored, 5 simulated
    minutes, kmax 2..3; ``hours`` and ``kmax`` override the scale's.

    The kmax rows are independent: ``jobs`` processes run them in parallel (default: one
    per CPU at full scale, one at quick scale). With ``out``, each row is written to
    ``<out>/fig5_rows/k<kmax>.json`` as it completes, and each simulated run to
    ``<out>/fig5_rows/trials`` (:class:`TrialCache`); ``resume=True`` reuses rows found
    there with the same parameters (scale, seed, targets, guarantee) instead of re-running them,
    and in a row not finished the runs that were (a month row takes hours). ``trials``: keep the
    simulated runs in this folder instead; runs are shared by both metrics (:func:`_reusable`),
    so a max run and a p99 run with different ``out`` can share one. ``thetas``: other targets
    than :data:`FIG5_THETAS` (most generous first); a run already made at a target is reused.
    ``volatility``: the network's rates of delay spikes and outages, as multiples of the
    model's (:func:`fig1_setting`; what differs most from the paper's PlanetLab trace).
    """
    if metric not in FIG5_METRICS:
        raise ValueError(f"metric must be one of {', '.join(FIG5_METRICS)}, got {metric!r}")
    thetas = tuple(float(f) for f in (FIG5_THETAS if thetas is None else thetas))
    if not thetas or any(not 0 < f <= 1 for f in thetas) or any(a <= b for a, b in zip(thetas, thetas[1:])):
        raise ValueError(f"thetas must be fractions in (0, 1], decreasing, got {list(thetas)}")
    monitored, hours, kmax = _fig5_scale(quick, hours, kmax)
    if not (volatility >= 0 and math.isfinite(volatility)):
        raise ValueError(f"volatility must be a finite number >= 0, got {volatility!r}")
    params = _fig5_params(quick, seed, hours, damping, create, metric, thetas, volatility)
    rows_dir = os.path.join(out, "fig5_rows") if out else None
    # every simulated run is kept under <out>/fig5_rows/trials (or ``trials``); --resume also reuses
    # them (a row stopped halfway goes on from its last finished run)
    opts = {"hours": hours, "damping": damping, "create": create, "metric": metric, "thetas": thetas,
            "volatility": volatility,
            "trials_dir": trials or (os.path.join(rows_dir, "trials") if rows_dir else None), "reuse": bool(resume)}
    found: dict[int, dict] = {}
    if rows_dir and resume:
        for k in kmax:
            path = os.path.join(rows_dir, f"k{k}.json")
            if os.path.exists(path):
                with open(path) as fh:
                    saved = json.load(fh)
                if saved.get("params") == params:
                    found[k] = saved["row"]

    def keep(row: dict) -> None:
        found[row["k"]] = row
        if rows_dir:
            os.makedirs(rows_dir, exist_ok=True)
            with open(os.path.join(rows_dir, f"k{row['k']}.json"), "w") as fh:
                json.dump({"params": params, "row": row}, fh, indent=1, default=jsonable)

    todo = [k for k in kmax if k not in found]
    jobs = (1 if quick else (os.cpu_count() or 1)) if jobs is None else max(1, jobs)
    if jobs == 1 or len(todo) <= 1:
        for k in todo:
            keep(_fig5_row(k, quick, seed, progress, **opts))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: a forked child would inherit the parent's threads (Ray's, Spark's) mid-state
        with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=multiprocessing.get_context("spawn")) as ex:
            futs = [ex.submit(_fig5_row, k, quick, seed, False, **opts) for k in sorted(todo, reverse=True)]  # longest first
            for fut in as_completed(futs):
                keep(fut.result())
    rows = [found[k] for k in kmax]
    data = {"experiment": "fig5", **params, "rows": rows, "reused_rows": sorted(set(kmax) - set(todo)),
            "paper": "GC saves the cost of stream replicas that do not help, a larger share at higher kmax; "
                     "GC + revival saves more (bars read from Fig. 5, not given as numbers in the text)"}
    if out:
        _write(out, "fig5", data, [{k: v for k, v in r.items() if k != "tried"} for r in rows])
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        ks = np.array([r["k"] for r in rows], dtype=float)
        for j, (key, label) in enumerate((("static_cost", "static min-cost"), ("gc_cost", "garbage-collection"),
                                          ("revival_cost", "garbage-collection / revival"))):
            ax.bar(ks + (j - 1) * 0.27, [r[key] for r in rows], width=0.27, label=label)
        ax.set_xticks(ks)
        ax.set_xlabel("maximum degree of replication (kmax)")
        ax.set_ylabel("network cost (x non-replicated)")
        ax.set_title(f"Fig. 5: network cost at {metric} latency <= {FIG5_GUARANTEE_S:g} s, {hours:g} simulated hours")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, "fig5.png"), dpi=110)
        plt.close(fig)
    return data


def plot_fig5_guarantees(files: list[str], path: str) -> None:
    """Fig. 5 under both guarantees, side by side: the bars (static, GC, GC + revival) per kmax of
    the ``fig5.json`` files given (their ``metric`` max or p99), each GC bar labelled with the
    target kept; written to ``path`` (docs/experiments/fig5_lookahead_24h.png).

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); f = os.path.join(d, "fig5.json")
    >>> r = {"k": 3, "static_cost": 24.0, "gc_cost": 8.8, "revival_cost": 8.9, "gc_theta": 0.25, "revival_theta": 0.25}
    >>> _ = open(f, "w").write(json.dumps({"metric": "max", "simulated_hours": 24, "rows": [r]}))
    >>> plot_fig5_guarantees([f], os.path.join(d, "x.png")); os.path.exists(os.path.join(d, "x.png"))
    True
    """
    rows: dict[str, dict] = {"max": {}, "p99": {}}
    hours = set()
    for f in files:
        with open(f) as fh:
            d = json.load(fh)
        hours.add(d.get("simulated_hours"))
        for r in d["rows"]:
            rows[d.get("metric", "max")][r["k"]] = r
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, m in zip(axes, ("max", "p99")):
        rs = [rows[m][k] for k in sorted(rows[m])]
        ax.set_title(f"{'maximum' if m == 'max' else '99th percentile'} latency <= {FIG5_GUARANTEE_S:g} s")
        if not rs:
            continue
        ks = np.array([r["k"] for r in rs], dtype=float)
        for j, (key, th, label) in enumerate((("static_cost", None, "static min-cost"),
                                              ("gc_cost", "gc_theta", "garbage-collection"),
                                              ("revival_cost", "revival_theta", "garbage-collection / revival"))):
            ax.bar(ks + (j - 1) * 0.27, [r[key] for r in rs], width=0.27, label=label)
            for x, r in zip(ks, rs):
                if th and r.get(th) is not None:
                    ax.text(x + (j - 1) * 0.27, r[key], f"{r[th]:.0%}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(ks)
        ax.set_xlabel("maximum degree of replication (kmax)")
    axes[0].set_ylabel("network cost (x non-replicated)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Fig. 5, {'/'.join(f'{h:g}' for h in sorted(hours))} simulated h, revival inside the batched engine "
                 f"(labels: the target kept)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table_fig5(data: dict) -> str:
    lines = [f"{'kmax':<5} {'static':>8} {'GC':>8} {'GC+revival':>10}  {'theta GC':>8} {'theta rev':>9} "
             f"{'max s static/GC/rev':>20}"]
    for r in data["rows"]:
        mx = f"{r['static_max_s']:.3f}/{r['gc_max_s']:.3f}/{_fmt(r['revival_max_s'])}"
        lines.append(f"{r['k']:<5} {r['static_cost']:>7.2f}x {r['gc_cost']:>7.2f}x {r['revival_cost']:>9.2f}x  "
                     f"{_fmt(r['gc_theta'], 'g'):>8} {_fmt(r['revival_theta'], 'g'):>9} {mx:>20}")
    return "\n".join(lines)


# -- helpers -----------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def jsonable(o):
    """``json.dump``'s ``default`` for the experiments' data: numpy scalars and arrays as Python values.

    >>> json.dumps({"n": np.int64(3), "v": np.arange(2)}, default=jsonable)
    '{"n": 3, "v": [0, 1]}'
    """
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
        json.dump(data, f, indent=1, default=jsonable)
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, keys)
            w.writeheader()
            for r in rows:
                w.writerow({k: (json.dumps(v, default=jsonable) if isinstance(v, (dict, list)) else v)
                            for k, v in r.items()})


def table(data: dict) -> str:
    """The short table an experiment prints (one line per row of its data).

    >>> print(table({"experiment": "fig4", "rows": [{"strategy": "min-cost", "k": 1, "p50_s": 0.1,
    ...     "p99_s": 0.2, "max_s": 0.3, "bandwidth_ratio": 1.0, "cost_ratio": 1.0, "ccdf": {"1.0": 0.0}}]}))
    strategy  k    p50 s   p99 s   max s  P(>1 s)  bandwidth  cost
    min-cost  1    0.100   0.200   0.300  0            1.00x    1.00x

    A partitioned run ends with the partitions that ran, per node (fig3 and fig4 ``--parallelism``).
    """
    text = _TABLES[data["experiment"]](data)
    if data.get("parallelism"):
        text += f"\npartitions per node: {_parts_text(data)}"
        if any(r.get("partitions") for r in data.get("rows", ())):
            text += (" (entry.P on the entry points' servers, app.P spread from the application's server: "
                     "--json rows' partitions)")
    return text


def _table_fig4(data: dict) -> str:
    lines = [f"{'strategy':<9} {'k':<2} {'p50 s':>7} {'p99 s':>7} {'max s':>7}  {'P(>1 s)':<8} {'bandwidth':>9}  cost"]
    for r in data["rows"]:
        lines.append(f"{r['strategy']:<9} {r['k']:<2} {r['p50_s']:>7.3f} {r['p99_s']:>7.3f} {r['max_s']:>7.3f}  "
                     f"{r['ccdf']['1.0']:<8.3g} {r['bandwidth_ratio']:>8.2f}x {r['cost_ratio']:>7.2f}x")
    return "\n".join(lines)


# -- verdicts: the first line a run prints, beside the paper's claim ---------------------------------

def verdict(data: dict) -> str:
    """One line that compares an experiment's result with the paper's claim and says whether it
    holds: what ``replistream sim`` prints first.

    >>> rows = [{"strategy": s, "k": 3, "ccdf": {"0.1": q, "0.25": r, "1.0": 0.0}, "cost_ratio": c, "p99_s": p99}
    ...         for s, q, r, c, p99 in (("min-cost", 0.109, 0.0, 25.8, 0.141), ("random", 0.527, 2e-4, 43.9, 0.184))]
    >>> verdict({"experiment": "fig4", "rows": rows})
    "fig4: min-cost k=3 keeps P(latency > 1 s) = 0 at 0.59x random's network cost (P(latency > 0.25 s) 0 against random's 0.0002; p99 0.141 s against 0.184 s); paper 0.82x (10.99x vs 13.39x): holds"
    """
    line = _VERDICTS[data["experiment"]](data)
    if data.get("parallelism"):  # a partitioned run says so (replistream sim fig4 --parallelism ...)
        line += f" [partitioned: {_parts_text(data)}]"
    return line


def _parts_text(data: dict) -> str:
    """What ran partitioned, node by node, with the key bins when operators are partitioned by key.

    >>> _parts_text({"parallelism": {"entry": 2, "correlate": 2}, "bits": 4})
    'entry in 2, correlate in 2 (16 bins)'
    >>> _parts_text({"parallelism": {"alerts": 3}})
    'alerts in 3'
    """
    parts = ", ".join(f"{node} in {p}" for node, p in data["parallelism"].items())
    return parts + (f" ({2 ** data['bits']} bins)" if data.get("bits") is not None else "")


def _verdict_fig4(data: dict) -> str:
    rows = {(r["strategy"], r["k"]): r for r in data["rows"]}
    ks = sorted(k for s, k in rows if s == "min-cost" and ("random", k) in rows)
    if not ks:
        return "fig4: no kmax ran with both strategies: nothing to compare with the paper"
    k = 3 if 3 in ks else ks[-1]
    mc, rnd = rows[("min-cost", k)], rows[("random", k)]
    p = mc["ccdf"]["1.0"]
    ratio = mc["cost_ratio"] / rnd["cost_ratio"]
    holds = p == 0 and ratio < 1
    # what tells the strategies apart at this scale (#44: at --quick scale P(> 1 s) is 0 for both): the
    # largest latency whose tail differs, and the p99
    apart = [x for x in sorted(mc["ccdf"], key=float) if mc["ccdf"][x] != rnd["ccdf"].get(x)]
    parts = []
    if apart:
        x = apart[-1]
        parts.append(f"P(latency > {float(x):g} s) {mc['ccdf'][x]:.3g} against random's {rnd['ccdf'][x]:.3g}")
    if "p99_s" in mc and "p99_s" in rnd:
        parts.append(f"p99 {mc['p99_s']:.3g} s against {rnd['p99_s']:.3g} s")
    vs = f" ({'; '.join(parts)})" if parts else ""
    return (f"fig4: min-cost k={k} keeps P(latency > 1 s) = {p:.3g} at {ratio:.2f}x random's network cost{vs}; "
            f"paper 0.82x (10.99x vs 13.39x): {'holds' if holds else 'does not hold'}")


def _verdict_fig3(data: dict) -> str:
    rows = sorted(data["rows"], key=lambda r: r["k"])
    means = [r["mean_s"] for r in rows]
    stds = [r["std_s"] for r in rows]
    down = all(b <= a for a, b in zip(means, means[1:])) and all(b <= a for a, b in zip(stds, stds[1:]))
    ks = ", ".join(str(r["k"]) for r in rows)
    return (f"fig3: kmax {ks}: mean latency {' -> '.join(f'{m:.3f}' for m in means)} s, std "
            f"{' -> '.join(f'{x:.3f}' for x in stds)} s; paper: both decrease with more replicas: "
            f"{'holds' if down else 'does not hold'}")


def _verdict_fig2(data: dict) -> str:
    rows = {r["strategy"]: r for r in data["rows"]}
    none, rep = rows["no replication"], rows["replication"]
    others = [rows[s] for s in ("synchronization", "deterministic") if s in rows]
    stops = none["delivered_after_crash"] == 0
    lowest = all(rep["mean_before_s"] is not None and o["mean_before_s"] is not None
                 and rep["mean_before_s"] <= o["mean_before_s"] for o in others)
    rest = ", ".join(f"{o['strategy']} {_fmt(o['mean_before_s'])} s" for o in others)
    crash = data.get("crash", {})
    return (f"fig2: {crash.get('server', 'a server')} killed at {crash.get('at_s', '?')} s: no replication delivers "
            f"{none['delivered_after_crash']} tuples after it, replication all of them at mean latency "
            f"{_fmt(rep['mean_before_s'])} s before it ({rest}); paper: no output without replication, replication "
            f"lowest: {'holds' if stops and lowest else 'does not hold'}")


def _verdict_table1(data: dict) -> str:
    ours = [r["ours_ratio"][-1] for r in data["rows"]]
    paper = [r["paper_ratio_vs_k1"][-1] for r in data["rows"]]
    grows = all(all(b >= a for a, b in zip(r["ours_ratio"], r["ours_ratio"][1:])) for r in data["rows"])
    below = all(x < 4 for x in ours)
    return (f"table1: per-replica CPU at k=4 is {min(ours):.2f}-{max(ours):.2f}x k=1's (measured on the Ray runtime, "
            f"not simulated); paper {min(paper):.2f}-{max(paper):.2f}x: grows with k, less than k-fold: "
            f"{'holds' if grows and below else 'does not hold'}")


def _verdict_fig5(data: dict) -> str:
    rows = data["rows"]
    if not rows:
        return "fig5: no kmax row ran: nothing to compare with the paper"
    guarantee = data.get("guarantee_s", FIG5_GUARANTEE_S)
    gc_saves = all(r["gc_cost"] < r["static_cost"] for r in rows)
    rv_more = all(r["revival_cost"] is not None and r["revival_cost"] <= r["gc_cost"] for r in rows)
    top = max(rows, key=lambda r: r["k"])
    rv = "-" if top["revival_cost"] is None else f"{top['revival_cost']:.2f}x"
    return (f"fig5: kmax={top['k']} at {data.get('metric', 'max')} latency <= {guarantee:g} s: network cost {top['static_cost']:.2f}x static, "
            f"{top['gc_cost']:.2f}x with GC, {rv} with GC + revival (kmax {', '.join(str(r['k']) for r in rows)}); "
            f"paper: GC saves, GC + revival saves more: {'holds' if gc_saves and rv_more else 'does not hold'}")


_VERDICTS: dict[str, Callable[[dict], str]] = {"fig2": _verdict_fig2, "fig3": _verdict_fig3, "fig4": _verdict_fig4,
                                               "fig5": _verdict_fig5, "table1": _verdict_table1,
                                               "rescale": _verdict_rescale}


_TABLES: dict[str, Callable[[dict], str]] = {"fig2": _table_fig2, "fig3": _table_fig3, "fig4": _table_fig4,
                                             "fig5": _table_fig5, "table1": _table_table1,
                                             "rescale": _table_rescale}

EXPERIMENTS: dict[str, Callable[..., dict]] = {"fig2": fig2, "fig3": fig3, "fig4": fig4, "fig5": fig5,
                                               "table1": table1, "rescale": rescale}


def run_experiment(name: str, quick: bool = False, seed: int = 0, out: str | None = None,
                   progress: bool = False, **options) -> dict:
    """Run experiment ``name`` (one of :data:`EXPERIMENTS`); ``options`` go to experiments
    that take them (``jobs``, ``resume``: :func:`fig5`; ``parallelism``, ``bits``: :func:`fig3`,
    :func:`fig4`) and must be ``None`` for the others.

    >>> run_experiment("fig9")
    Traceback (most recent call last):
    ...
    ValueError: unknown experiment 'fig9'; known: fig2, fig3, fig4, fig5, rescale, table1
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    options = {k: v for k, v in options.items() if v is not None}
    partitioned = {k: options.pop(k) for k in ("parallelism", "bits") if k in options}
    if partitioned and name not in ("fig3", "fig4"):
        raise ValueError(f"{name} takes no option {', '.join(sorted(partitioned))} (fig3 and fig4 do)")
    if options and name != "fig5":
        raise ValueError(f"{name} takes no option {', '.join(sorted(options))} (fig5 does)")
    options.update(partitioned)
    return EXPERIMENTS[name](quick=quick, seed=seed, out=out, progress=progress, **options)

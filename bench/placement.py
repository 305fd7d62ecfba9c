"""Placement benchmarks: speed of min-cost placement, and min-cost versus random network cost.

    python bench/placement.py              # both parts, about 5 s on a quiet machine
    python bench/placement.py --json       # one JSON object on stdout
    python bench/placement.py --only speed # or --only ratio

**1. Speed** (the placement issue's target: 100 servers, a 20-operator query,
kmax = 5 placed in under 1 s). Servers: the first 100 built-in cities; latency
matrix: the static geographic model (``GeoLatencyModel(static=True)``,
built once, timed separately). Query:
``replistream.placement.synthetic.random_query(20 operators, 10 sources,
seed)``, a random DAG of Filters and Unions, sources on seeded random
servers, rates estimated (10 tuples/s per source, seeded selectivities).
Timed: ``problem_from_query`` (building the problem from the query) plus
``min_cost(problem, k=5, alpha=0.8, d_min=30)`` (classical MDS, spring
relaxation, refinement, four phases of Algorithm 5, explanations), with
``time.perf_counter``, for ``--query-seeds`` queries x ``--reps``
repetitions after one warm-up. The greedy first phase (``initial="greedy"``)
and random placement are timed the same way for comparison; their network
costs are reported relative to the spring start's.

**2. Min-cost versus random** (the issue's "done when"). The Fig. 1 query
over the 30 built-in servers, every server monitored (60 sources, ``load_i``
and ``ping_i`` on server ``i``); rates measured in a 600 s test run of the
reference engine with one reading per source every 10 s; latencies: the
static geographic model. For k = 1..5: the min-cost network cost (alpha 0.8,
d_min 30 ms) against random placement with seeds 0..19 (every replica on a
uniformly random distinct server, as in the paper's Fig. 4): the ratio
min-cost / random per seed, and bandwidth and cost relative to the
non-replicated placement. A second setting draws a different set of 30
cities for every seed (``default_servers(30, seed)``) and compares min-cost
with random on that set.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np

from replistream import run_reference
from replistream.network import GeoLatencyModel, default_servers
from replistream.placement import QueryStats, fig1_sources, min_cost, place, problem_from_query, random_placement
from replistream.placement.coords import embedding_error, network_coordinates
from replistream.placement.synthetic import random_query, random_selectivity, random_sources
from replistream.workloads import fig1_inputs, fig1_query


def _summary(xs) -> dict:
    xs = sorted(xs)
    return {"n": len(xs), "min": xs[0], "median": statistics.median(xs),
            "p90": xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))], "max": xs[-1]}


def speed(query_seeds: int, reps: int) -> dict:
    servers = default_servers(100)
    t = time.perf_counter()
    latency = GeoLatencyModel(servers, static=True).base_matrix()
    t_latency = time.perf_counter() - t
    out: dict = {"servers": 100, "operators": 20, "sources": 10, "k": 5, "latency_matrix_s": t_latency,
                 "embedding_error_3d": embedding_error(latency, network_coordinates(latency, 3))}
    timings: dict[str, list[float]] = {"min-cost (spring start)": [], "min-cost (greedy start)": [], "random": []}
    costs, greedy = [], []
    for qs in range(query_seeds):
        q = random_query(20, 10, seed=qs)
        stats = QueryStats.estimate(q, source_rate=10.0, selectivity=random_selectivity(q, seed=qs))
        sources = random_sources(q, servers, seed=qs)

        def run(kind):
            problem = problem_from_query(q, servers, latency, stats, sources=sources)
            if kind == "random":
                return random_placement(problem, 5, seed=qs)
            return min_cost(problem, 5, alpha=0.8, d_min=30.0,
                            initial="spring" if kind.endswith("(spring start)") else "greedy")

        for kind in timings:
            run(kind)  # warm-up
            for _ in range(reps):
                t = time.perf_counter()
                pl = run(kind)
                timings[kind].append(time.perf_counter() - t)
            if kind == "min-cost (spring start)":
                mc = pl.network_cost
            elif kind == "min-cost (greedy start)":
                greedy.append(pl.network_cost / mc)
            elif kind == "random":
                costs.append(mc / pl.network_cost)
    out["seconds"] = {k: _summary(v) for k, v in timings.items()}
    out["min_cost_over_random_same_seed"] = _summary(costs)
    out["greedy_start_over_spring_start"] = _summary(greedy)
    out["target_met"] = out["seconds"]["min-cost (spring start)"]["max"] < 1.0
    return out


def ratio(seeds: int, kmax: int) -> dict:
    servers = default_servers(30)
    q = fig1_query(30)
    stats = QueryStats.from_run(q, run_reference(q, fig1_inputs(30, duration_s=600, period_s=10, seed=0)), 600.0)
    problem = problem_from_query(q, servers, stats=stats, sources=fig1_sources(q, servers))
    base = place(problem, 1, "non-replicated")
    rows = []
    for k in range(1, kmax + 1):
        mc = place(problem, k, "min-cost", alpha=0.8, d_min=30.0)
        rnd = [random_placement(problem, k, seed=s) for s in range(seeds)]
        r = [mc.network_cost / x.network_cost for x in rnd]
        rows.append({
            "k": k, "min_cost": mc.network_cost, "random_mean": statistics.mean(x.network_cost for x in rnd),
            "ratio": _summary(r), "beats_every_seed": all(v < 1 for v in r),
            "min_cost_relative": mc.relative_to(base),
            "random_relative_mean": {
                "bandwidth": statistics.mean(x.relative_to(base)["bandwidth"] for x in rnd),
                "network_cost": statistics.mean(x.relative_to(base)["network_cost"] for x in rnd)},
        })
    varied = []
    for s in range(seeds):
        srv = default_servers(30, seed=s)
        p = problem_from_query(q, srv, stats=stats, sources=fig1_sources(q, srv))
        varied.append(place(p, 3, "min-cost").network_cost / place(p, 3, "random", seed=s).network_cost)
    return {"servers": 30, "query": "fig1 (30 monitored servers)", "seeds": seeds, "by_k": rows,
            "k3_varied_servers": {"ratio": _summary(varied), "beats_every_seed": all(v < 1 for v in varied)}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["speed", "ratio"])
    ap.add_argument("--query-seeds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--kmax", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = {"python": platform.python_version(), "numpy": np.__version__,
           "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.only in (None, "speed"):
        out["speed"] = speed(args.query_seeds, args.reps)
    if args.only in (None, "ratio"):
        out["ratio"] = ratio(args.seeds, args.kmax)
    if args.json:
        print(json.dumps(out))
        return 0
    if "speed" in out:
        sp = out["speed"]
        print(f"Speed: 100 servers, 20-operator query, k=5 ({args.query_seeds} queries x {args.reps} runs); "
              f"latency matrix {sp['latency_matrix_s']:.3f} s (not included)")
        for kind, s in sp["seconds"].items():
            print(f"  {kind:<26} median {s['median'] * 1000:7.1f} ms  p90 {s['p90'] * 1000:7.1f} ms  "
                  f"max {s['max'] * 1000:7.1f} ms")
        print(f"  target < 1 s: {'met' if sp['target_met'] else 'NOT met'}")
        g, r = sp["greedy_start_over_spring_start"], sp["min_cost_over_random_same_seed"]
        print(f"  network cost, greedy start / spring start: {g['min']:.3f}-{g['max']:.3f}; "
              f"min-cost / random (same seed): {r['min']:.3f}-{r['max']:.3f}")
    if "ratio" in out:
        ra = out["ratio"]
        print(f"\nMin-cost vs random, Fig. 1 query, 30 servers, {ra['seeds']} random seeds per k")
        print(f"  {'k':>2} {'min-cost':>10} {'random mean':>12} {'ratio min':>9} {'median':>7} {'max':>6} "
              f"{'beats all':>9} {'rel bw':>7} {'rel cost':>8} {'rand rel cost':>13}")
        for r in ra["by_k"]:
            print(f"  {r['k']:>2} {r['min_cost']:>10.4g} {r['random_mean']:>12.4g} {r['ratio']['min']:>9.3f} "
                  f"{r['ratio']['median']:>7.3f} {r['ratio']['max']:>6.3f} {str(r['beats_every_seed']):>9} "
                  f"{r['min_cost_relative']['bandwidth']:>6.2f}x {r['min_cost_relative']['network_cost']:>7.2f}x "
                  f"{r['random_relative_mean']['network_cost']:>12.2f}x")
        v = ra["k3_varied_servers"]
        print(f"  k=3, a different 30-city set per seed: ratio min {v['ratio']['min']:.3f} median "
              f"{v['ratio']['median']:.3f} max {v['ratio']['max']:.3f}, beats every seed: {v['beats_every_seed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tune replica placement for the paper's Fig. 1 query (Hwang §V-A, Fig. 4).

Sweeps the degree of replication k, the load threshold alpha and the minimum
peer distance d_min for min-cost placement (Algorithm 5) over the built-in
servers, prints the network cost and the bandwidth and cost relative to the
non-replicated placement for every setting, compares with random placement,
and plots network cost against k per strategy. It then places the Join in two
key partitions (``parallelism={"correlate": 2}``, Algorithm 5 per partition:
each carries half the Join's load) and simulates ten minutes of both placements
over the wide-area model, output checked against the ideal run. Finally it
deploys one tuned placement on Ray over the emulated wide-area network and
checks the output against the ideal run.

    python examples/placement_tuning.py                       # 30 servers, k = 1..5
    python examples/placement_tuning.py --servers 10 --kmax 3 --seeds 5 --plot cost.png --no-deploy

Rates are measured in a test run of the reference engine (one reading per
source every 10 s, as in the paper's experiments). Loads are *assumptions* of
this example, to show what alpha does: every server already runs other work
(a seeded uniform load in [0, 0.5] of its capacity), and one replica costs
0.05 (entry points, Unions, Filter) or 0.2 (Join) of a server.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

from replistream.network import default_servers
from replistream.placement import (PlacementError, PlacementPolicy, QueryStats, ServerSet, fig1_sources, place,
                                   problem_from_query)
from replistream.testing import as_multiset, run_reference
from replistream.workloads import fig1_inputs, fig1_query

LOADS = {"entry": 0.05, "loads": 0.05, "pings": 0.05, "correlate": 0.2, "hot": 0.05}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", type=int, default=30, help="built-in servers, each monitored (default 30)")
    ap.add_argument("--kmax", type=int, default=5, help="largest k to sweep (default 5)")
    ap.add_argument("--alphas", default="0.5,0.7,0.9", help="alpha values (default 0.5,0.7,0.9)")
    ap.add_argument("--d-mins", dest="d_mins", default="0,30,70", help="d_min values in ms (default 0,30,70)")
    ap.add_argument("--seeds", type=int, default=20, help="random placements per k (default 20)")
    ap.add_argument("--plot", default=os.path.join(tempfile.gettempdir(), "placement_cost.png"),
                    help="where to write the cost-vs-k plot (default: placement_cost.png in the temp directory)")
    ap.add_argument("--no-deploy", action="store_true", help="skip the Ray deployment at the end")
    args = ap.parse_args(argv)

    servers = default_servers(args.servers)
    latency = ServerSet(tuple(servers)).latency()
    query = fig1_query(n_servers=args.servers)
    inputs = fig1_inputs(args.servers, duration_s=600, period_s=10, seed=0)
    stats = QueryStats.from_run(query, run_reference(query, inputs), 600.0, loads=LOADS)
    sources = fig1_sources(query, servers)
    background = np.random.default_rng(0).uniform(0.0, 0.5, len(servers))
    problem = problem_from_query(query, servers, latency, stats, sources=sources, server_load=background)
    alphas = [float(a) for a in args.alphas.split(",")]
    d_mins = [float(d) for d in args.d_mins.split(",")]
    base = place(problem, 1, "non-replicated", alpha=max(alphas))
    print(f"Fig. 1 query over {args.servers} servers ({len(query.sources)} sources); non-replicated placement: "
          f"network cost {base.network_cost:.4g}, bandwidth {base.bandwidth:.4g} bytes/s")

    print(f"\n{'k':>2} {'alpha':>5} {'d_min':>5}  {'network cost':>12}  {'rel. bandwidth':>14}  {'rel. cost':>9}")
    mincost: dict[tuple[float, float], list] = {}
    for alpha in alphas:
        for d_min in d_mins:
            for k in range(1, args.kmax + 1):
                try:
                    pl = place(problem, k, "min-cost", alpha=alpha, d_min=d_min)
                except PlacementError as e:
                    print(f"{k:>2} {alpha:>5g} {d_min:>5g}  infeasible: {e}")
                    mincost.setdefault((alpha, d_min), []).append(None)
                    continue
                rel = pl.relative_to(base)
                mincost.setdefault((alpha, d_min), []).append(pl.network_cost)
                print(f"{k:>2} {alpha:>5g} {d_min:>5g}  {pl.network_cost:>12.4g}  {rel['bandwidth']:>13.2f}x  "
                      f"{rel['network_cost']:>8.2f}x")

    print(f"\nrandom placement, {args.seeds} seeds per k (no constraints, as in the paper's Fig. 4):")
    randoms = []
    ref_alpha, ref_dmin = alphas[-1], (30.0 if 30.0 in d_mins else d_mins[0])
    for k in range(1, args.kmax + 1):
        costs = [place(problem, k, "random", seed=s).network_cost for s in range(args.seeds)]
        randoms.append(costs)
        mc = mincost[(ref_alpha, ref_dmin)][k - 1]
        ratio = "" if mc is None else (f"; min-cost (alpha {ref_alpha:g}, d_min {ref_dmin:g}) / random: "
                                       f"{mc / max(costs):.2f}-{mc / min(costs):.2f}, beats every seed: "
                                       f"{all(mc < c for c in costs)}")
        print(f"k={k}: mean {statistics.mean(costs):.4g}, min {min(costs):.4g}, max {max(costs):.4g}{ratio}")

    _plot(args, mincost, randoms, alphas, d_mins)
    print(f"\nplot written to {args.plot}")

    if _partitioned(query, servers, latency, stats, sources, background, ref_alpha, ref_dmin):
        return 1

    if args.no_deploy:
        return 0
    return _deploy(query, servers, stats, sources, background, ref_alpha, ref_dmin)


def _partitioned(query, servers, latency, stats, sources, background, alpha, d_min) -> int:
    """The Join in 2 key partitions, k=2: where Algorithm 5 puts each partition's replicas, and ten
    simulated minutes of it and of the unpartitioned placement (issue #41); 1 if an output differs."""
    from replistream.sim import Simulator
    from replistream.sim.traces import month_model
    from replistream.testing import assert_same_output

    parts = {"correlate": 2}
    try:
        whole = place(problem_from_query(query, servers, latency, stats, sources=sources, server_load=background),
                      2, "min-cost", alpha=alpha, d_min=d_min)
        split = place(problem_from_query(query, servers, latency, stats, sources=sources, server_load=background,
                                         parallelism=parts, bits=8), 2, "min-cost", alpha=alpha, d_min=d_min)
    except PlacementError as e:
        print(f"\ncorrelate in 2 partitions, k=2: infeasible: {e}")
        return 0
    print(f"\ncorrelate (the Join) in 2 key partitions of 2**8 bins, k=2, min-cost (alpha {alpha:g}, d_min "
          f"{d_min:g} ms):")
    for node in ("correlate.0", "correlate.1"):
        print(f"  {node}: {', '.join(split.plan()[node])}")
    inputs = fig1_inputs(len(servers), duration_s=600, period_s=10, seed=2)
    ideal = run_reference(query, inputs)
    network = month_model(len(servers), seed=0)
    for label, pl, kw in (("unpartitioned", whole, {}), ("2 partitions", split, {"parallelism": parts, "bits": 8})):
        res = Simulator(query, pl.plan(), network, sources=sources, **kw).run(inputs)
        try:
            assert_same_output(ideal.outputs["alerts"], res.outputs["alerts"])
        except AssertionError as e:
            print(f"  {label}: alerts differ from the ideal run: {e}")
            return 1
        lat = res.latencies("alerts")[1]
        print(f"  {label:<13} network cost {pl.network_cost:>10.4g}; simulated 600 s: {lat.size} alerts, identical "
              f"to the ideal run, latency p50 {np.median(lat):.3f} s, max {lat.max():.3f} s")
    return 0


def _plot(args, mincost, randoms, alphas, d_mins) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = np.arange(1, args.kmax + 1)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    alpha = alphas[-1]
    for d_min in d_mins:
        ys = [np.nan if c is None else c for c in mincost[(alpha, d_min)]]
        ax.plot(ks, ys, marker="o", label=f"min-cost, alpha {alpha:g}, d_min {d_min:g} ms")
    mean = [statistics.mean(c) for c in randoms]
    ax.plot(ks, mean, marker="s", color="black", label=f"random (mean of {args.seeds} seeds)")
    ax.fill_between(ks, [min(c) for c in randoms], [max(c) for c in randoms], color="grey", alpha=0.25,
                    label="random (min-max)")
    ax.set_yscale("log")
    ax.set_xticks(ks)
    ax.set_xlabel("k (replicas per operator)")
    ax.set_ylabel("network cost (bytes/s x ms)")
    ax.set_title("Fig. 1 query: network cost by degree of replication")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)


def _deploy(query, servers, stats, sources, background, alpha, d_min) -> int:
    """Deploy the tuned min-cost placement (k=2) on Ray and check it against the ideal run."""
    import replistream as rs

    policy = PlacementPolicy("min-cost", stats=stats, sources=sources, server_load=background, alpha=alpha,
                             d_min=d_min)
    offline = policy.placement(query, servers, 2)  # the static geographic model, as "geo-static" with seed 0
    inputs = fig1_inputs(len(servers), duration_s=60, period_s=10, seed=1, chunk=6)
    print(f"\ndeploying min-cost, k=2, alpha {alpha:g}, d_min {d_min:g} ms on Ray (emulated WAN) ...")
    with rs.deploy(query, servers=servers, k=2, placement=policy, network="geo-static") as dep:
        result = dep.run(inputs, timeout=300)
        import ray

        cost = ray.get(dep.coordinator.network_cost.remote())
        same_plan = dep.plan == offline.plan()
    ideal = run_reference(query, inputs)
    same = as_multiset(ideal.outputs["alerts"]) == as_multiset(result.outputs["alerts"])
    print(f"deployed plan equals the offline placement: {same_plan}; coordinator's network cost {cost:.4g} "
          f"(offline {offline.network_cost:.4g})")
    if not (same and result.complete and same_plan):
        print("alerts differ from the ideal run" if not same else "the deployment did not match the plan")
        return 1
    print(f"alerts: {len(result.outputs['alerts'])} tuples, identical to the ideal run")
    return 0


if __name__ == "__main__":
    sys.exit(main())

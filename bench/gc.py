"""Garbage-collection benchmark: one Algorithm 6 step and a full collection (Hwang §V-B).

    python bench/gc.py                 # a few seconds
    python bench/gc.py --json          # one JSON object on stdout
    python bench/gc.py --reps 5 --query-seeds 3

Snapshot: ``replistream.placement.synthetic.random_query(20 operators, 10
sources, seed)`` (a random DAG of Filters and Unions), kmax = 5 replicas of
the entry points and of every operator on seeded random distinct servers
among the first 100 built-in cities, one server per application; every
upstream replica feeds every downstream replica (5 x 5 stream replicas per
edge). Latency: the static geographic model
(``GeoLatencyModel(...).base_matrix``). Rates: 10 tuples/s per source, seeded
selectivities for Filters (``random_selectivity``), Unions add their inputs.
Weights: what a duplicate filter measures over 30 s when the fastest stream
replica always delivers first: on each input port of each replica, the
stream replicas ranked by latency get ``rate x 30 / rank``. kmin = 2, theta =
25% of the initial cost.

Timed with ``time.perf_counter`` after one warm-up, ``--reps`` times per
query seed: ``utilities`` (utility propagation), one step (``collect_step``:
utilities, dependents of every live stream replica, the choice of D*, the new
snapshot), and the full ``collect_garbage`` until cost <= theta.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time

from replistream.gc import collect_garbage, collect_step, snapshot_from_plan, utilities
from replistream.network import GeoLatencyModel, default_servers
from replistream.placement.synthetic import random_query, random_selectivity


def build(seed: int, k: int = 5, n_ops: int = 20, n_sources: int = 10, kmin: int = 2, theta_share: float = 0.25):
    q = random_query(n_ops, n_sources, seed=seed)
    names = [s.name for s in default_servers(100)]
    lat = GeoLatencyModel(names, seed=0).base_matrix(names)
    index = {n: i for i, n in enumerate(names)}
    rng = random.Random(seed)
    plan = {"entry": rng.sample(names, k)}
    plan.update({op: rng.sample(names, k) for op in q.operators})
    plan.update({app: [rng.choice(names)] for app in q.sinks})
    sel = random_selectivity(q, seed=seed)
    rates: dict[str, float] = {}
    for node in q.topological():
        kind = q.spec(node).kind
        if kind == "source":
            rates[node] = 10.0
        elif kind == "operator":
            rates[node] = sum(rates[u] for u in q.inputs_of(node)) * sel.get(node, 1.0)
    snap = snapshot_from_plan(q, plan, rates=rates, latency=lambda a, b: lat[index[a], index[b]], kmin=kmin)
    weights = {}
    for r in snap.replicas:
        for p in snap.ports(r.label):
            ins = sorted(snap.in_streams(r.label, p), key=lambda s: (s.latency_ms, s.id))
            weights.update({s.id: s.rate * 30.0 / (rank + 1) for rank, s in enumerate(ins)})
    snap = snap.with_weights(weights)
    return q, snap.evolve(theta=theta_share * snap.total_cost())


def machine() -> str:
    """CPU model, core count, Python version."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def _timed(fn, reps: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def run(query_seeds: int, reps: int) -> dict:
    rows = []
    for seed in range(query_seeds):
        q, snap = build(seed)
        result = collect_garbage(snap)
        rows.append({
            "seed": seed, "operators": len(q.operators), "sources": len(q.sources), "applications": len(q.sinks),
            "stream_replicas": len(snap.streams), "cost_before": snap.total_cost(), "theta": snap.theta,
            "cost_after": result.cost_after, "steps": result.steps, "stopped": result.stopped,
            "live_stream_replicas_after": len(result.snapshot.live_streams()),
            "utilities_s": _timed(lambda: utilities(snap), reps),
            "step_s": _timed(lambda: collect_step(snap), reps),
            "collect_s": _timed(lambda: collect_garbage(snap), reps),
        })
    med = lambda key: statistics.median(x for r in rows for x in r[key])  # noqa: E731
    return {"machine": machine(),
            "command": " ".join(["python"] + sys.argv), "kmax": 5, "kmin": 2, "theta_share": 0.25,
            "median_utilities_s": med("utilities_s"), "median_step_s": med("step_s"),
            "median_collect_s": med("collect_s"), "median_steps": statistics.median(r["steps"] for r in rows),
            "queries": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--query-seeds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = run(args.query_seeds, args.reps)
    if args.json:
        print(json.dumps(out))
        return
    print(f"Algorithm 6 on a 20-operator query, kmax=5, kmin=2, theta=25% of the initial cost ({out['machine']})")
    for r in out["queries"]:
        print(f"  seed {r['seed']}: {r['stream_replicas']} stream replicas, cost {r['cost_before']:.0f} -> "
              f"{r['cost_after']:.0f} (theta {r['theta']:.0f}) in {r['steps']} steps, "
              f"{r['live_stream_replicas_after']} left; utilities {statistics.median(r['utilities_s']) * 1e3:.1f} ms, "
              f"one step {statistics.median(r['step_s']) * 1e3:.1f} ms, "
              f"full collection {statistics.median(r['collect_s']):.2f} s; {r['stopped']}")
    print(f"median: utilities {out['median_utilities_s'] * 1e3:.1f} ms, one step {out['median_step_s'] * 1e3:.1f} ms, "
          f"full collection {out['median_collect_s']:.2f} s ({out['median_steps']:.0f} steps)")


if __name__ == "__main__":
    main()

"""Latency by hop of a paced keyed count (issue #42, point 2): a benchmark, not a test.

    python bench/latency.py                                  # k = 1 and 3, 60 s each
    python bench/latency.py --k 1 3 --seconds 60 --out docs/experiments/latency_by_hop.json

The workload of ``bench/runtime.py --only paced`` (W2: a keyed 1 s tumbling count of 10,000 keys,
punctuation every 10 ms) is fed paced at ``--rate`` events per second for ``--seconds`` s in a
fresh deployment per k. Every replica remembers when its punctuation rose, in and out
(``punctuation_times()`` of each actor). For each window end ``E`` the close is followed from the
source to the application, taking the first replica of each stage (the path the result takes:
the fastest copy):

* ``feed``: the first entry replica's call that raised its punctuation to ``E - 1``, from ``E``'s
  wall time (the feeder's pacing and the call to the entry points);
* ``entry``: that entry replica's work until the punctuation left;
* ``channel entry->window``, ``window``, ``channel window->app``: the same, stage by stage (the
  window's own time includes computing and emitting the window's counts);
* ``total``: from ``E``'s wall time until the application's punctuation reached ``E - 1`` (its
  counts arrived before it).

Per hop: p50 / p99 / max over the windows after the first ``--skip`` s, the maximum per 4-second
span of arrival time, and the share of those spans whose maximum exceeds twice the median span.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchrecord import record, write  # noqa: E402
from runtime import SERVERS, paced_workload  # noqa: E402  (the W2 workload of the runtime benchmark)

WINDOW_US = 1_000_000  # the workload's windows (1 s)


def _first_at_or_above(times: list, p: int) -> float | None:
    """The first wall time at which a rising punctuation reached ``p``."""
    for q, wall in times:
        if q >= p:
            return wall
    return None


def hops(dep, stages: list[tuple[str, list[str]]]) -> list[dict]:
    """Per window end, the wall time at which each stage's first replica took and gave on its
    close (``punctuation_times`` of every replica), and the hops between them."""
    import ray

    times = {label: ray.get(dep.handles[label].punctuation_times.remote(), timeout=30)
             for _, labels in stages for label in labels}
    t0, ts0, pace = dep.t0, dep.ts0, dep.speed or 1.0
    last = max((q for t in times.values() for q, _ in t["in"] if q < 2 ** 62), default=ts0)
    rows = []
    for end in range((int(ts0) // WINDOW_US + 1) * WINDOW_US, int(last) + 1, WINDOW_US):
        due = t0 + (end - ts0) / (1e6 * pace)
        row = {"end_s": round((end - ts0) / 1e6, 3), "due": due}
        for name, labels in stages:
            ins = [w for w in (_first_at_or_above(times[l]["in"], end - 1) for l in labels) if w is not None]
            outs = [w for w in (_first_at_or_above(times[l]["out"], end - 1) for l in labels) if w is not None]
            row[name] = (min(ins) if ins else None, min(outs) if outs else None)
        rows.append(row)
    return rows


def by_hop(rows: list[dict], stages: list[str], skip_s: float) -> dict:
    """p50 / p99 / max (ms) of every hop over the windows after ``skip_s``, and the maxima per 4 s."""
    names, series = [], {}
    for i, st in enumerate(stages):
        if i == 0:
            names.append(("feed", lambda r, st=st: r[st][0] - r["due"]))
        else:
            prev = stages[i - 1]
            names.append((f"channel {prev}->{st}", lambda r, st=st, prev=prev: r[st][0] - r[prev][1]))
        if i < len(stages) - 1:
            names.append((st, lambda r, st=st: r[st][1] - r[st][0]))
    names.append(("total", lambda r: r[stages[-1]][0] - r["due"]))
    kept = [r for r in rows if r["end_s"] >= skip_s and all(r[s][0] is not None for s in stages)
            and all(r[s][1] is not None for s in stages[:-1])]
    at = np.array([r["end_s"] for r in kept])
    for name, f in names:
        v = np.array([f(r) * 1e3 for r in kept])
        spans = [float(v[(at >= a) & (at < a + 4)].max()) for a in np.arange(skip_s, at.max() + 1e-9, 4.0)
                 if ((at >= a) & (at < a + 4)).any()] if len(v) else []
        med = float(np.median(spans)) if spans else float("nan")
        series[name] = {"p50": round(float(np.percentile(v, 50)), 1), "p99": round(float(np.percentile(v, 99)), 1),
                        "max": round(float(v.max()), 1), "max_per_4s": [round(x, 1) for x in spans],
                        "spiky_share": round(sum(x > 2 * med for x in spans) / len(spans), 3) if spans else None}
    series["windows"] = len(kept)
    return series


def one(k: int, args) -> dict:
    """One paced run at replication ``k`` in a fresh deployment: latency by hop."""
    from replistream import deploy
    from replistream.engines.ray.pool import clear_pool

    clear_pool()
    q, data, n, check = paced_workload(args.rate, args.seconds, keys=10_000, seed=args.seed)
    with deploy(q, servers=SERVERS, k=k, network="zero", progress=False) as dep:
        res = dep.run(data, pace=1.0, timeout=args.seconds * 5 + 120)
        bad = check(res)
        labels = list(dep.handles)
        stages = [("entry", sorted(l for l in labels if l.startswith("entry#"))),
                  ("window", sorted(l for l in labels if l.startswith("window#"))),
                  ("app", sorted(l for l in labels if l == "counts" or l.startswith("counts#")))]
        rows = hops(dep, stages)
        _, lat = dep.latencies_ms("counts")
    result = by_hop(rows, [s for s, _ in stages], args.skip)
    return {"k": k, "exact": bad is None, "error": bad, "events": n, "replicas": {s: len(l) for s, l in stages},
            "output_latency_ms": {"p50": round(float(np.percentile(lat, 50)), 1),
                                  "p99": round(float(np.percentile(lat, 99)), 1), "max": round(float(lat.max()), 1)},
            "hops_ms": result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=[1, 3], help="replication factors (default 1 3)")
    ap.add_argument("--rate", type=float, default=20_000.0, help="events per second of wall time (default 20,000)")
    ap.add_argument("--seconds", type=float, default=60.0, help="event time fed per run (default 60 s)")
    ap.add_argument("--skip", type=float, default=10.0, help="seconds left out at the start (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the record (JSON) here")
    args = ap.parse_args()
    if args.rate <= 0 or args.seconds <= args.skip + 4:
        ap.error("--rate must be > 0 and --seconds more than --skip + 4")
    if any(k < 1 for k in args.k):
        ap.error("--k must be >= 1")
    runs = []
    for k in args.k:
        print(f"k={k}: {args.seconds:g} s paced at {args.rate:,.0f} events/s ...", file=sys.stderr, flush=True)
        r = one(k, args)
        runs.append(r)
        print(f"k={k} exact={r['exact']} output latency p50/p99/max {r['output_latency_ms']}", flush=True)
        for hop, v in r["hops_ms"].items():
            if isinstance(v, dict):
                print(f"  {hop:<24} p50 {v['p50']:>7.1f}  p99 {v['p99']:>7.1f}  max {v['max']:>7.1f} ms  "
                      f"spans over 2x median {v['spiky_share']}", flush=True)
    figures = {f"k={r['k']}, {hop}": f"p50 {v['p50']} ms, p99 {v['p99']} ms, max {v['max']} ms"
               for r in runs for hop, v in r["hops_ms"].items() if isinstance(v, dict)}
    write(args.out, record(f"load average {os.getloadavg()[0]:.1f} at the end",
                           params={k: v for k, v in vars(args).items() if k != "out"}, runs=runs, figures=figures))


if __name__ == "__main__":
    main()

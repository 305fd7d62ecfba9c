"""Live rescaling under load (issue #41; Megaphone §5 style): a benchmark, not a test.

    python bench/rescale.py                           # fluid and all-at-once, 1 -> 2 -> 4, 2^12 bins
    python bench/rescale.py --out docs/experiments/rescale.json

A keyed tumbling count (``--window`` s, ``--keys`` keys, so about that many open windows: the state
a rescale moves), or with ``--op count`` Megaphone's own operator, a running count per key
(``KeyedCount``: one row of state per key for the whole run, every key loaded in the first 100 ms
of event time, and an output for each key that changed at each punctuation), or with ``--op join``
a key-equality Join of two sources over a ``--window`` s window (``--rate`` split between them,
``--keys`` keys: the buffered tuples a rescale moves), is fed paced at ``--rate`` events per second of wall time (k = 2, deployed with
``parallelism={"per_key": 1}``, 2^``--bits`` bins, ``--spares`` warm spares for the new
partitions' processes). Once the feed has run ``--warm`` s, the operator is rescaled 1 -> 2, then
2 -> 4, with one strategy; each strategy runs in a fresh deployment of its own (one process, one
after the other, the actor pool emptied before each), ``--repeat`` times, alternating. Per
strategy: the end-to-end latency of every output tuple (arrival minus its timestamp's wall time),
its maximum and 99th percentile while each rescale runs (from the call to its return, plus one
window; the next rescale starts after that), its maximum while the bins move (from the switch on), against the same in the 5 s before the first
one; the rescale's phases (``phases_s``: the feed sends nothing past the switch time ``T0`` during
``gated``, ``feed_held`` in records before 2026-11-30's gate, when it sent nothing at all); and whether
the output equals the reference run. The figures are medians over the runs. With ``--timeline``,
also the maximum latency per 100 ms around each rescale, for keys of moving and of staying bins
apart: how the pauses of the giving and of the taking replicas were found (docs/migration.md).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np


def _query(args):
    from replistream import Query, seconds
    from replistream.operators.keyed import KeyedCount

    q = Query("rescale")
    s = q.source("s", {"k": "i8"}, punctuate_every=seconds(args.punctuate_ms / 1000.0))
    if args.op == "count":  # Megaphone's running count: a row of state per key, every key kept
        s.apply(KeyedCount(by="k", bits=args.bits), name="per_key").sink("out")
    elif args.op == "join":  # a Join's two windows of buffered tuples, split by key
        r = q.source("r", {"k": "i8"}, punctuate_every=seconds(args.punctuate_ms / 1000.0))
        s.join(r, window=seconds(args.window), on="k", name="per_key").sink("out")
    else:
        s.window(size=seconds(args.window), by="k", aggs={"n": "count"}, name="per_key").sink("out")
    return q.build()


def _inputs(events: int, rate: float, keys: int, seed: int = 5, chunk: int = 2_000, load: bool = False):
    """``events`` events paced at ``rate`` per second of event time over ``keys`` random keys; with
    ``load``, every key once first, in the first 100 ms of event time (the state a rescale moves)."""
    rng = np.random.default_rng(seed)
    ts = (np.arange(events, dtype=np.int64) * (1e6 / rate)).astype(np.int64)
    k = rng.integers(0, keys, events)
    chunks = []
    if load:  # (in chunks of at least 20,000 rows: the load is not what is measured)
        lts, lk, big = np.arange(keys, dtype=np.int64) * 100_000 // keys, rng.permutation(keys), max(chunk, 20_000)
        chunks = [{"ts": lts[a:a + big], "k": lk[a:a + big]} for a in range(0, keys, big)]
        ts = ts + 100_000
    return {"s": chunks + [{"ts": ts[a:a + chunk], "k": k[a:a + chunk]} for a in range(0, len(ts), chunk)]}


def _join_inputs(events: int, rate: float, keys: int, seed: int = 5, chunk: int = 2_000):
    """``events`` events paced at ``rate`` per second of event time, alternating between the Join's
    two sources ``s`` and ``r`` (half the rate each), over ``keys`` random keys."""
    rng = np.random.default_rng(seed)
    ts = (np.arange(events, dtype=np.int64) * (1e6 / rate)).astype(np.int64)
    k = rng.integers(0, keys, events)
    out = {}
    for name, sl in (("s", slice(0, None, 2)), ("r", slice(1, None, 2))):
        t, kk, c = ts[sl], k[sl], max(1, chunk // 2)
        out[name] = [{"ts": t[a:a + c], "k": kk[a:a + c]} for a in range(0, len(t), c)]
    return out


def _tail(args) -> float:
    """How long after a rescale's return its effects are counted: one window (a window's results
    come at its end), or 1 s for the running count and the Join (their results come at every
    punctuation or tuple)."""
    return args.window if args.op == "window" else 1.0


def _one(strategy: str, args, data, ref) -> dict:
    from replistream import deploy
    from replistream.engines.ray.pool import clear_pool
    from replistream.engines.ray.view import event_kind, event_text
    from replistream.testing import assert_same_output

    clear_pool()  # (no strategy starts its new partitions in processes an earlier one left)
    with deploy(_query(args), servers=3, k=2, parallelism={"per_key": 1}, bits=args.bits,
                spares=args.spares, progress=False) as dep:
        t_feed = time.time()
        dep.feed(data, pace=1.0)
        tick = __import__("threading").Event()
        while time.time() - t_feed < args.warm:
            tick.wait(0.05)
        spans, recs = [], []
        for p in (2, 4):
            a = time.time() - dep.t0
            rec = dep.rescale("per_key", p, strategy=strategy, bins_per_step=args.bins_per_step, gap_ms=args.gap_ms)
            b = time.time() - dep.t0
            ph = rec["phases_s"]
            moved = a + ph["routing"] + ph["new_partitions"]  # the switch: the bins begin to move
            spans.append((a, moved, b + _tail(args)))
            recs.append({k: rec[k] for k in ("from", "to", "steps", "bins_moved", "seconds", "phases_s", "waves")
                         if k in rec})
            waves = f", {len(rec['waves'])} waves, last gap {rec['waves'][-1]['gap_ms']} ms" if rec.get("waves") else ""
            print(f"  {strategy} {rec['from']} -> {rec['to']}: {rec['steps']} steps, {rec['seconds']:.2f} s "
                  f"{rec['phases_s']}{waves}", file=sys.stderr)
            while time.time() - dep.t0 < b + _tail(args):  # (the next rescale after this one's window)
                tick.wait(0.05)
        dep.wait(timeout=3600)
        # how long the feed itself waited at each rescale's switch time (its gate; none when the
        # hand-out ended before the paced feed reached T0)
        gate_waits = [round(float(w), 4) for w in (getattr(dep.feeder, "gate_waits", None) or [])]
        arr, lat = dep.latencies_ms("out")
        # (a replica the failure detector declared failed, a death: masked, yet the run's figures carry it)
        faults = [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in e.items()}
                  for e in list(dep.events) if event_kind(e) in ("fault", "error")]
        for e in faults:
            print(f"  {strategy}: at {e.get('t', 0):.1f} s, {event_text(e)}", file=sys.stderr)
        res = dep.collect()
    try:
        assert_same_output(ref, res.outputs["out"])
        exact = True
    except AssertionError as e:
        print(f"  {strategy}: NOT EXACT: {str(e)[:300]}", file=sys.stderr)
        exact = False
    # (the 5 s before the first rescale: the floor it starts from, after any backlog of the load)
    before = lat[(arr > max(args.warm / 2, spans[0][0] - 5.0)) & (arr < spans[0][0])]
    if rec_left := [r for (a, m, b), r in zip(spans, recs) if b - _tail(args) > args.seconds]:
        print(f"  {strategy}: the feed ended before rescale {rec_left[0]['from']} -> {rec_left[0]['to']} did: "
              f"give more --seconds", file=sys.stderr)
    out = {"strategy": strategy, "exact": exact, "rescales": recs, "faults": faults, "gate_waits_s": gate_waits,
           "before": {"max_ms": round(float(before.max()), 1) if len(before) else None,
                      "p99_ms": round(float(np.percentile(before, 99)), 1) if len(before) else None}}
    if args.timeline:
        out["timeline"] = _timeline(args, res.outputs["out"], arr, lat, spans, recs, strategy)
    for (a, m, b), r in zip(spans, recs):
        during, moving = lat[(arr >= a) & (arr <= b)], lat[(arr >= m) & (arr <= b)]
        out[f"{r['from']}->{r['to']}"] = {"max_ms": round(float(during.max()), 1) if len(during) else None,
                                         "p99_ms": round(float(np.percentile(during, 99)), 1) if len(during) else None,
                                         "tuples": int(len(during)),
                                         "max_ms_moving": round(float(moving.max()), 1) if len(moving) else None}
    return out


def _timeline(args, out, arr, lat, spans, recs, strategy, step_s: float = 0.1) -> list:
    """Per rescale, the maximum latency in each ``step_s`` of arrival time (from 0.3 s before its
    call to the end of its window), apart for the results of keys whose bin moves in it and of the
    others (which partition keeps them): a pause of the giving side shows in both, one of the
    taking side in the moving keys only. Printed, and returned for the record."""
    from replistream.partition import BinMap, Router, assign_bins

    n_bins = 1 << args.bits
    bins = Router(_query(args), "per_key", BinMap.even(1, args.bits)).bins(0, out)
    rows = []
    for (a, _, b), r in zip(spans, recs):
        moved = (assign_bins(n_bins, r["from"]) != assign_bins(n_bins, r["to"]))[bins]
        print(f"  {strategy} {r['from']} -> {r['to']}: max latency (ms) per {step_s:g} s, moving | staying keys",
              file=sys.stderr)
        for t in np.arange(a - 0.3, b, step_s):
            sel = (arr >= t) & (arr < t + step_s)
            mv, st = lat[sel & moved], lat[sel & ~moved]
            row = {"rescale": f"{r['from']}->{r['to']}", "t_s": round(float(t - a), 2),
                   "moving_n": int(len(mv)), "moving_max_ms": round(float(mv.max()), 1) if len(mv) else None,
                   "staying_n": int(len(st)), "staying_max_ms": round(float(st.max()), 1) if len(st) else None}
            rows.append(row)
            print(f"    {row['t_s']:6.2f} s  {row['moving_max_ms'] or 0:7.1f} ({row['moving_n']:5d})  |  "
                  f"{row['staying_max_ms'] or 0:7.1f} ({row['staying_n']:5d})", file=sys.stderr)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", choices=("window", "count", "join"), default="window",
                    help="window: a keyed tumbling count (--window s); count: Megaphone's running count per key "
                         "(KeyedCount), every key loaded first, so the state is --keys rows; join: a key-equality "
                         "Join of two sources over a --window s window")
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--chunk", type=int, default=2_000, help="rows per input chunk (the feed sends a chunk at a time)")
    ap.add_argument("--punctuate-ms", type=float, default=100.0,
                    help="event time between two punctuations of the source (results of the running count come "
                         "at punctuations)")
    ap.add_argument("--rate", type=float, default=10_000.0, help="events per second (wall time, paced)")
    ap.add_argument("--seconds", type=float, default=60.0, help="event time fed")
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--bits", type=int, default=12)
    ap.add_argument("--warm", type=float, default=8.0)
    ap.add_argument("--bins-per-step", type=int, default=64, help="for --strategies batched")
    ap.add_argument("--gap-ms", type=float, default=None,
                    help="event time between two steps (fluid, batched); none: a fluid rescale paces itself in "
                         "waves, batched steps 1 ms apart")
    ap.add_argument("--spares", type=int, default=6, help="warm spares (deploy(spares=)): the new partitions' processes")
    ap.add_argument("--strategies", default="fluid,all-at-once")
    ap.add_argument("--repeat", type=int, default=3, help="runs per strategy (alternating); the figures are medians")
    ap.add_argument("--timeline", action="store_true",
                    help="print (and record) the maximum latency per 100 ms around each rescale, for keys whose "
                         "bin moves and for the others apart (a pause of the giving or the taking side)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    strategies = [s.strip() for s in args.strategies.split(",")]
    bad = [s for s in strategies if s not in ("fluid", "batched", "all-at-once")]
    if bad:
        ap.error(f"unknown strategy {bad[0]!r}; choose from fluid, batched, all-at-once")
    from replistream.testing import run_reference

    events = int(args.rate * args.seconds)
    if args.op == "join":
        data = _join_inputs(events, args.rate, args.keys, chunk=args.chunk)
    else:
        data = _inputs(events, args.rate, args.keys, load=args.op == "count", chunk=args.chunk)
    print(f"reference run of {sum(len(c['ts']) for v in data.values() for c in v):,} events ...", file=sys.stderr)
    ref = run_reference(_query(args), data).outputs["out"]
    load = os.getloadavg()[0]
    runs = []
    for rep in range(args.repeat):  # (strategies alternate: the machine's drift falls on both)
        for s in (strategies if rep % 2 == 0 else strategies[::-1]):
            runs.append({**_one(s, args, data, ref), "repeat": rep})
    figures = {}
    med: dict[tuple, float] = {}
    for s in strategies:
        mine = [r for r in runs if r["strategy"] == s]
        for step in ("1->2", "2->4"):
            vals = [r[step]["max_ms"] for r in mine if r[step]["max_ms"] is not None]
            med[s, step] = float(np.median(vals)) if vals else None
            figures[f"{s} {step}: max latency during (median of {len(vals)})"] = f"{med[s, step]} ms"
            figures[f"{s} {step}: max latency during, each run"] = ", ".join(f"{v} ms" for v in vals)
            figures[f"{s} {step}: max latency while bins move, each run"] = \
                ", ".join(f"{r[step]['max_ms_moving']} ms" for r in mine)
        figures[f"{s}: max latency before, each run"] = ", ".join(f"{r['before']['max_ms']} ms" for r in mine)
    if "fluid" in strategies and "all-at-once" in strategies:
        for step in ("1->2", "2->4"):
            f, a = med["fluid", step], med["all-at-once", step]
            if f and a:
                figures[f"fluid / all-at-once max latency {step} (medians)"] = f"{f / a:.2f}"
    rec = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} ({os.cpu_count()} cores)",
           "load": round(load, 2), "command": "python " + " ".join(sys.argv), "figures": figures, "runs": runs,
           "all_exact": all(r["exact"] for r in runs)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)
    print("\n".join(f"{k}: {v}" for k, v in figures.items()))
    return 0 if rec["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

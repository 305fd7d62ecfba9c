"""Speed of the simulator (issue #7, deliverable 6): simulated time per wall-clock second.

    python bench/sim.py                 # 2 simulated hours of the scenario below
    python bench/sim.py --hours 720     # the whole month (the issue's target: < 10 minutes)
    python bench/sim.py --json
    python bench/sim.py --batch 0       # the per-packet engine (one reading per chunk)

Scenario: the Fig. 1 query over 30 servers (the first 30 built-in cities), every
server monitored (a load and a ping source on each: 60 sources), one reading per
source every 10 s, join window 10 s, k = 3 (min-cost placement, Algorithm 5),
the time-varying GeoLatencyModel (seed 0), the default CPU model, sources located
at their servers. Inputs are generated lazily, an hour of readings per chunk (the
batched engine releases each reading at its own timestamp), and the applications
keep only timestamps and arrival times (``keep_outputs=False``). The simulator runs
batched (``Simulator(batch_s=--batch)``, replistream/sim/batch.py). A rich progress bar shows
simulated time.

Reported: wall seconds, simulated seconds, their ratio, events processed, output
tuples, latency percentiles, and the extrapolated wall time of a simulated month
at the measured ratio. The run checks that the application received one output
per joining (load, ping) pair, as the reference run would give (the reference itself is only
run with ``--check``, for short spans: it costs about as much as the simulation).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from replistream.placement import min_cost
from replistream.sim import Simulator
from replistream.sim.experiments import fig1_setting

MONTH_S = 30 * 86400


def lazy_inputs(n: int, duration_s: float, period_s: float, seed: int, chunk_s: float = 3600.0) -> dict:
    """{source: generator of column chunks}: fig1_inputs' shape, generated lazily, ``chunk_s`` of
    readings per chunk (the batched engine releases each reading at its own timestamp; the
    per-packet engine needs ``chunk_s <= period_s``, one reading per chunk).

    Per server i: a fixed phase, then a reading every period_s; the ping follows the load
    reading by 1 µs (so each load reading joins with its ping), as in fig1_inputs.
    """
    rng = np.random.default_rng(seed)
    period = int(period_s * 1e6)
    steps = int(duration_s / period_s)
    per = max(1, int(chunk_s / period_s))
    phases = rng.integers(0, period, n)

    def gen(i: int, kind: str):
        for c, a in enumerate(range(0, steps, per)):
            j = np.arange(a, min(steps, a + per))
            r = np.random.default_rng((seed, i, kind == "ping", c))
            ts = int(phases[i]) + period * j
            if kind == "load":
                yield {"ts": ts, "server": np.full(len(j), i, dtype=np.int32),
                       "cpu": np.maximum(0.0001, np.round(r.beta(2, 5, len(j)), 4))}
            else:
                yield {"ts": ts + 1, "src": np.full(len(j), i, dtype=np.int32),
                       "dst": ((i + 1 + j) % n).astype(np.int32), "rtt_ms": r.gamma(4.0, 20.0, len(j))}

    return {f"{kind}_{i}": gen(i, kind) for i in range(n) for kind in ("load", "ping")}


def fig5_run(args) -> int:
    """One GC + revival simulation of Fig. 5 (sim.experiments._gc_run) over ``args.hours``: the wall
    and CPU time, the progress (simulated hours against wall time) and the run's result."""
    from replistream.engines import run_reference
    from replistream.gc import collect_garbage
    from replistream.sim import experiments as E

    w_setting = fig1_setting(30, 10, args.weights_hours * 3600.0, seed=args.seed, chunk=E.FIG5_CHUNK)
    plan = min_cost(w_setting.problem, args.k).plan()
    base_cost = w_setting.base_placement().network_cost
    sim = Simulator(w_setting.query, plan, w_setting.network, sources=w_setting.sources, batch_s=E.FIG5_BATCH_S)
    sim.run(w_setting.inputs)
    snap0 = E._snapshot(w_setting, plan, weights=sim.weights())
    static = snap0.total_cost()
    snap = collect_garbage(snap0.evolve(theta=args.fig5 * static)).snapshot.evolve(theta=args.fig5 * static)
    st = fig1_setting(30, 10, args.hours * 3600.0, seed=args.seed, chunk=E.FIG5_CHUNK)
    t_ref = time.time()
    ref = run_reference(st.query, st.inputs)
    ref_wall = time.time() - t_ref
    t0, c0 = time.time(), time.process_time()
    progress = []

    def log(t):
        if not progress or t >= progress[-1]["simulated_h"] * 3600.0 + args.log_hours * 3600.0:
            progress.append({"simulated_h": t / 3600.0, "wall_s": round(time.time() - t0, 1),
                             "cpu_s": round(time.process_time() - c0, 1), "loadavg": os.getloadavg()})
            if not args.no_progress:
                print(f"fig5 theta={args.fig5:g} k={args.k}: {t / 3600:.0f} h simulated, "
                      f"{progress[-1]['wall_s']:.0f} s wall", file=sys.stderr, flush=True)

    r = E._gc_run(st, plan, snap, ref, revival=True, progress=False, damping=E.FIG5_DAMPING,
                  lookahead_s=None if args.no_lookahead else E.FIG5_LOOKAHEAD_S, log=log)
    wall, cpu = time.time() - t0, time.process_time() - c0
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg_end": os.getloadavg(),
           "command": " ".join(sys.argv), "k": args.k, "theta": args.fig5, "simulated_h": args.hours,
           "weights_hours": args.weights_hours, "lookahead_s": None if args.no_lookahead else E.FIG5_LOOKAHEAD_S,
           "wall_s": wall, "process_cpu_s": cpu, "reference_wall_s": ref_wall, "progress": progress,
           "cost_relative": r["cost"] / base_cost, **{k: v for k, v in r.items() if k != "cost"}}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    print(json.dumps(out, default=str) if args.json else
          f"fig5 k={args.k} theta={args.fig5:g}: {args.hours:g} simulated h in {wall:,.0f} s wall ({cpu:,.0f} s CPU); "
          f"cost {out['cost_relative']:.2f}x, max {r['max_s']:.3f} s, p99 {r['p99_s']:.3f} s, "
          f"{r['revivals']} revivals, look-ahead epochs {r['lookahead_epochs']}, misses {r['lookahead_misses']}")
    return 0 if r["exact"] else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, default=2.0, help="simulated hours (720 = a month)")
    ap.add_argument("--servers", type=int, default=30)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--period", type=float, default=10.0, help="seconds between readings per source")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=float, default=7200.0,
                    help="epoch of the batched engine, virtual s (0: the per-packet engine, one reading per chunk)")
    ap.add_argument("--check", action="store_true", help="also run the reference and compare outputs")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, metavar="FILE", help="also write the JSON result to FILE")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--fig5", type=float, default=None, metavar="THETA",
                    help="instead: one Fig. 5 GC + revival run (10 of 30 servers monitored, kmax --k) at target "
                         "THETA (a share of the static cost), timed, progress every --log-hours")
    ap.add_argument("--weights-hours", type=float, default=24.0,
                    help="--fig5: simulated hours of the static run whose filter weights GC starts from")
    ap.add_argument("--log-hours", type=float, default=24.0)
    ap.add_argument("--no-lookahead", action="store_true", help="--fig5: stop the engine at every coordinator call")
    args = ap.parse_args(argv)
    if args.fig5 is not None:
        return fig5_run(args)

    duration = args.hours * 3600.0
    st = fig1_setting(args.servers, args.servers, duration_s=60.0, seed=args.seed)  # the problem; inputs lazily below
    pl = min_cost(st.problem, args.k)
    chunk_s = 3600.0 if args.batch else args.period
    inputs = lazy_inputs(args.servers, duration, args.period, args.seed, chunk_s)
    sim = Simulator(st.query, pl.plan(), st.network, sources=st.sources, keep_outputs=args.check,
                    batch_s=args.batch or None)
    t0, c0 = time.time(), time.process_time()
    res = sim.run(inputs, progress=not args.no_progress, horizon_s=duration)
    wall, cpu = time.time() - t0, time.process_time() - c0
    steps = int(duration / args.period)
    readings = args.servers * (2 * steps - 1)  # load j joins ping j and ping j-1 (10 s window, 10 s period)
    arr, lat = res.latencies("alerts")
    out = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg": os.getloadavg(),
        "servers": args.servers, "sources": 2 * args.servers, "k": args.k, "period_s": args.period,
        "engine": f"batched, epoch {args.batch:g} s" if args.batch else "per-packet", "command": " ".join(sys.argv),
        "simulated_s": duration, "wall_s": wall, "process_cpu_s": cpu, "ratio": duration / wall,
        "month_wall_estimate_s": MONTH_S / (duration / wall),
        "outputs": int(len(lat)), "expected_outputs": readings, "complete": res.complete,
        "latency_s": {"p50": float(np.median(lat)), "p99": float(np.percentile(lat, 99)),
                      "p999": float(np.percentile(lat, 99.9)), "max": float(lat.max())},
        "network_cost": pl.network_cost,
    }
    ok = res.complete and len(lat) == readings
    if args.check:
        from replistream.engines import run_reference
        from replistream.testing import assert_same_output

        ref = run_reference(st.query, lazy_inputs(args.servers, duration, args.period, args.seed, chunk_s))
        assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
        out["checked_against_reference"] = True
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"simulated {duration:,.0f} s in {wall:,.1f} s wall ({cpu:,.1f} s CPU): ratio {out['ratio']:,.0f}x; "
              f"a month would take {out['month_wall_estimate_s'] / 60:,.1f} min at this ratio")
        print(f"outputs {out['outputs']:,} (expected {readings:,}), complete={res.complete}, latency p50 "
              f"{out['latency_s']['p50']:.3f} s, p99 {out['latency_s']['p99']:.3f} s, max {out['latency_s']['max']:.3f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

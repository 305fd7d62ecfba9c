"""Fig. 5 (Hwang §VI-F): does a shorter detection delay let revival keep the maximum latency?

One kmax and one GC target theta of Fig. 5's setting (10 of 30 servers monitored, seed 0): GC
alone, then GC + revival with the silence after which a port without new tuples observes a
delay (``silence_s`` of :meth:`~replistream.sim.Simulator.input_delays`, 60 s in Fig. 5) set
to each value given. Prints one JSON line per run and writes them all with the machine, the
load and the command to ``--json``.

    python bench/fig5_detection.py --hours 24 --kmax 3 --theta 0.18 --silence 60 10 3 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours")
    ap.add_argument("--kmax", type=int, default=3)
    ap.add_argument("--theta", type=float, default=0.18, help="GC target, a share of the static cost")
    ap.add_argument("--silence", type=float, nargs="+", default=[60.0, 10.0, 3.0], metavar="S",
                    help="silence (s) after which a port observes a delay, one revival run each")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, metavar="FILE")
    a = ap.parse_args(argv)
    if a.hours <= 0 or not 0 < a.theta < 1 or a.kmax < 1 or any(s <= 0 for s in a.silence):
        print("fig5_detection.py: error: --hours and --silence must be > 0, --theta in (0, 1), --kmax >= 1 "
              f"(got {a.hours}, {a.silence}, {a.theta}, {a.kmax})", file=sys.stderr)
        return 2

    from replistream.engines import run_reference
    from replistream.gc import collect_garbage
    from replistream.placement import min_cost
    from replistream.sim import Simulator
    from replistream.sim.experiments import (FIG5_CHUNK, FIG5_DAMPING, FIG5_PLAIN_BATCH_S, _gc_run, _snapshot,
                                             fig1_setting)

    load0 = os.getloadavg()
    st = fig1_setting(30, 10, a.hours * 3600.0, seed=a.seed, chunk=FIG5_CHUNK)
    ref = run_reference(st.query, st.inputs)
    plan = min_cost(st.problem, a.kmax).plan()
    sim = Simulator(st.query, plan, st.network, sources=st.sources, batch_s=FIG5_PLAIN_BATCH_S)
    sim.run(st.inputs)
    base = st.base_placement().network_cost
    snap0 = _snapshot(st, plan, weights=sim.weights())
    static = snap0.total_cost()
    g = collect_garbage(snap0.evolve(theta=a.theta * static))
    keys = ("exact", "max_s", "p99_s", "revivals", "discards", "observations_over_threshold", "lookahead_misses")
    runs = []
    for silence in [None, *a.silence]:
        c0 = time.process_time()
        if silence is None:
            r = _gc_run(st, plan, g.snapshot, ref, revival=False, progress=False)
        else:
            r = _gc_run(st, plan, g.snapshot.evolve(theta=a.theta * static), ref, revival=True, progress=False,
                        damping=FIG5_DAMPING, silence_s=silence)
        row = {"mode": "gc" if silence is None else "gc+revival", "silence_s": silence, "cost_x": r["cost"] / base,
               **{k: r[k] for k in keys}, "cpu_s": round(time.process_time() - c0, 1)}
        runs.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        rec = {"what": "Fig. 5 revival against the detection delay (silence_s)", "date": time.strftime("%Y-%m-%d"),
               "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
                          f"Python {platform.python_version()}",
               "load": f"load average {load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
               "command": "python bench/fig5_detection.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "hours": a.hours, "kmax": a.kmax, "theta": a.theta, "seed": a.seed, "runs": runs}
        with open(a.json, "w") as fh:
            json.dump(rec, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

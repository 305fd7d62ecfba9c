"""The steady state with no fault and no move (issue #42, point 1 and its first target): the
maximum latency per 4-second window of the queries ``bench/migration.py`` moves, and every pause
of Python's garbage collector in every actor, so a spike can be laid beside the collections that
happened in it. A benchmark, not a test.

    python bench/steady.py                                   # the count and the Join, defaults
    python bench/steady.py --operators keyed --steady 30     # one operator, shorter
    python bench/steady.py --collect-cost                    # one full collection, before and after freezing
    python bench/steady.py --compare-gc --out docs/experiments/steady.json
                         # each operator twice, alternating: the collector as Python sets it
                         # (REPLISTREAM_GC=default) and as the actors tune it (gcpause.py)

Each run is one fresh deployment in this process, as ``bench/migration.py`` deploys it (k=1,
three servers, ``flush_ms=2``), paced at ``--rate`` tuples/s after the 20 s load phase of
``--keys`` keys; latency is an output's arrival minus its timestamp's due time. Reported per run:
the maxima per 4 s window of arrival time, the largest of those after the first ``--skip`` seconds
of the run (the target: <= 50 ms for the count, <= 100 ms for the Join) and over the steady phase
alone, and per actor the collections by generation with their longest pause, and the pauses of
10 ms or more with the window they fell in. Output checked against the reference run.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.benchrecord import record, write  # noqa: E402
from bench.migration import build  # noqa: E402

WINDOW_S = 4.0
TARGET_MS = {"keyed": 50.0, "join": 100.0, "aggregate": 50.0}


def run(operator: str, keys: int, rate: int, steady_s: float, skip_s: float, check: bool) -> dict:
    import ray

    from replistream.engines.ray import deploy, init_ray
    from replistream.testing import assert_same_output, run_reference

    q, data, steady_start = build(operator, keys, rate, steady_s)
    out: dict = {"operator": operator, "keys": keys, "rate": rate, "steady_s": steady_s,
                 "gc": os.environ.get("REPLISTREAM_GC", "tuned") or "tuned"}
    init_ray()
    with deploy(q, servers=3, k=1, flush_ms=2.0) as dep:
        res = dep.run(data, pace=1.0, timeout=steady_s + 120)
        arrival, lat = dep.latencies_ms("out")
        stats = {label: ray.get(h.stats.remote(), timeout=30) for label, h in dep.handles.items()}
        t0 = dep.t0  # the feed's start: arrival times are seconds since it
    out["complete"] = bool(res.complete)
    order = np.argsort(lat)[::-1][:5]
    out["worst"] = [(round(float(arrival[i]), 3), round(float(lat[i]), 1)) for i in order]  # (arrival s, ms)
    run_start = 0.0
    edges = np.arange(run_start, arrival.max() + WINDOW_S, WINDOW_S)
    idx = np.searchsorted(edges, arrival, side="right") - 1
    maxima = [float(lat[idx == i].max()) if (idx == i).any() else None for i in range(len(edges) - 1)]
    steady_wall = run_start + steady_start / 1e6  # pace 1: event time from the feed's start
    out["windows"] = [{"start_s": round(float(edges[i] - run_start), 1), "max_ms": None if m is None else round(m, 1)}
                      for i, m in enumerate(maxima)]
    after = [m for e, m in zip(edges, maxima) if m is not None and e - run_start >= skip_s]
    steady = [m for e, m in zip(edges, maxima) if m is not None and e >= steady_wall]
    out["max_after_skip_ms"] = max(after) if after else None
    out["max_steady_ms"] = max(steady) if steady else None
    out["p99_ms"] = float(np.percentile(lat, 99))
    out["target_ms"] = TARGET_MS[operator]
    out["windows_over_target"] = sum(m > TARGET_MS[operator] for m in after)
    gcs = {}
    for label, s in stats.items():
        g = s.get("gc") or {}
        long_ = [(round(w - t0 - run_start, 2), gen, round(ms, 1)) for w, gen, ms in g.get("recent", []) if ms >= 10.0]
        gcs[label] = {"collections": g.get("collections"), "max_ms": g.get("max_ms"), "total_ms": g.get("total_ms"),
                      "frozen": g.get("frozen"), "pauses_10ms": long_, "cpu_s": round(s.get("cpu_seconds", 0.0), 2)}
    out["actors"] = gcs
    if check:
        try:
            assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
            out["exact"] = True
        except AssertionError as e:
            out["exact"] = False
            out["diff"] = str(e)[:300]
    return out


def collect_cost(reps: int = 5) -> dict:
    """What one full collection costs in a fresh Ray worker that imported the data-path actors, as
    Ray's own trigger (every ten minutes in every worker, and when the object store fills) would
    run it, before and after ``gc.freeze()`` (medians of ``reps``)."""
    import ray

    from replistream.engines.ray import init_ray

    init_ray()

    @ray.remote(num_cpus=0)
    class Probe:
        def measure(self, reps: int) -> dict:
            import gc
            import time

            import replistream.engines.ray.actors  # noqa: F401 (what a data-path actor imports)

            def full() -> float:
                times = []
                for _ in range(reps):
                    t = time.perf_counter()
                    gc.collect()
                    times.append((time.perf_counter() - t) * 1e3)
                return sorted(times)[len(times) // 2]

            out = {"tracked": len(gc.get_objects()), "full_ms": full()}
            gc.freeze()
            out.update({"frozen": gc.get_freeze_count(), "full_ms_frozen": full()})
            return out

    return ray.get(Probe.remote().measure.remote(reps), timeout=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--operators", nargs="*", default=["keyed", "join"], choices=("keyed", "join", "aggregate"))
    ap.add_argument("--keys", type=int, default=None, help="default: 1,000,000 (keyed), 200,000 (join, aggregate)")
    ap.add_argument("--rate", type=int, default=None, help="tuples/s in the steady phase (default: 10,000; join 500)")
    ap.add_argument("--steady", type=float, default=30.0, help="seconds of steady feed after the load phase")
    ap.add_argument("--skip", type=float, default=10.0, help="seconds of the run left out of the maximum")
    ap.add_argument("--compare-gc", action="store_true",
                    help="each operator twice, alternating REPLISTREAM_GC=default and the tuned collector")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="write the record here (JSON)")
    ap.add_argument("--collect-cost", action="store_true",
                    help="only: one full collection in a fresh Ray worker, before and after gc.freeze()")
    a = ap.parse_args(argv)
    if a.collect_cost:
        r = collect_cost()
        print(f"a full collection in a fresh worker: {r['full_ms']:.2f} ms over {r['tracked']:,} tracked objects; "
              f"after gc.freeze() ({r['frozen']:,} frozen): {r['full_ms_frozen']:.3f} ms")
        if a.out:
            write(a.out, record("load average {:.1f} {:.1f} {:.1f} at the start".format(*os.getloadavg()),
                                figures=r))
        return

    if a.one:  # a child: one run, its record as JSON on the last line of stdout
        op = a.operators[0]
        r = run(op, a.keys, a.rate, a.steady, a.skip, not a.no_check)
        print(json.dumps(r))
        return
    load = "load average {:.1f} {:.1f} {:.1f} at the start".format(*os.getloadavg())
    runs = []
    modes = ["default", "tuned"] if a.compare_gc else [os.environ.get("REPLISTREAM_GC", "tuned")]
    for op in a.operators:
        keys = a.keys or (1_000_000 if op == "keyed" else 200_000)
        rate = a.rate or (500 if op == "join" else 10_000)
        for mode in modes:
            env = dict(os.environ)
            env.pop("REPLISTREAM_GC", None)
            if mode == "default":
                env["REPLISTREAM_GC"] = "default"
            print(f"{op}: {keys:,} keys, {rate:,}/s, collector {mode}, a fresh process ...", flush=True)
            cmd = [sys.executable, os.path.abspath(__file__), "--one", "--operators", op, "--keys", str(keys),
                   "--rate", str(rate), "--steady", str(a.steady), "--skip", str(a.skip)] + (
                ["--no-check"] if a.no_check else [])
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"the run of {op} ({mode}) failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            runs.append(r)
            worst = max(((l, max(g["max_ms"] or [0])) for l, g in r["actors"].items()), key=lambda x: x[1])
            print(f"  max per 4 s window after {a.skip:.0f} s: {r['max_after_skip_ms']:.1f} ms (target "
                  f"{r['target_ms']:.0f}; {r['windows_over_target']} windows over), steady {r['max_steady_ms']:.1f} ms, "
                  f"p99 {r['p99_ms']:.1f} ms, exact {r.get('exact')}; longest collection {worst[1]:.1f} ms ({worst[0]})",
                  flush=True)
            print("  worst outputs (arrival s, latency ms):", r["worst"], flush=True)
            print("  windows:", ", ".join(f"{w['max_ms']:.0f}" if w["max_ms"] is not None else "-"
                                          for w in r["windows"]), flush=True)
            for label, g in r["actors"].items():
                n = g["collections"] or [0, 0, 0]
                print(f"  {label}: collections {n}, longest {g['max_ms']} ms, cpu {g['cpu_s']} s; pauses >= 10 ms "
                      f"(s into the run, gen, ms): {g['pauses_10ms'][:10]}", flush=True)
    if a.out:
        figures = {f"{r['operator']}_{r['gc']}_{i}": {"max_after_skip_ms": r["max_after_skip_ms"],
                                                      "max_steady_ms": r["max_steady_ms"], "p99_ms": r["p99_ms"]}
                   for i, r in enumerate(runs)}
        write(a.out, record(load, figures=figures, runs=runs))


if __name__ == "__main__":
    main()

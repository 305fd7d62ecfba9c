"""A replica that stops answering, masked like a crashed one (issue #28; a benchmark, not a test).

    python bench/slowness.py                     # every case once, 30 s of wall time each
    python bench/slowness.py --wall 12 --quick   # a smoke run
    python bench/slowness.py --json out.json     # also write every run's figures

Each run deploys the paper's Fig. 1 query (``replistream.workloads``, 3 monitored servers,
a reading every 0.5 s) at k=2 on four local servers and feeds ``--duration`` event seconds
paced so that they last ``--wall`` seconds (by default 60 s at pace 2: a healthy run keeps up
on a quiet 2-core machine; at pace 4 or with 10 monitored servers it falls behind, stopped
replica or not, since every tuple costs a few actor calls). A third of the way in it
stops one process with SIGSTOP (``Deployment.stop_replica``), never resumed:

* ``healthy``: nothing is stopped (the baseline);
* ``operator``: replica 0 of the Join;
* ``entry``: entry replica 0;
* ``application``: application replica 1 of 2 (``app_replicas=2``);
* ``repair``: as ``operator``, deployed with ``repair=True`` and one warm spare: the Join is
  back to k replicas once the replacement is installed (``repaired`` event).

Per run: wall time of ``run()``; p99 latency of the results delivered before and after the
stop; seconds from the stop to "declared failed" (the failure detector's event); whether the
output equals the reference run (exact, as a multiset). A run that differs exits 1.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import platform
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SERVERS = ["boston", "london", "tokyo", "paris"]
CASES = ["healthy", "operator", "entry", "application", "repair"]


def run_case(case: str, wall: float, duration: float, fail_after: float, suspect_after: float) -> dict:
    import replistream as rs
    from replistream.testing import assert_same_output, run_reference
    from replistream.workloads import fig1_inputs, fig1_query

    q = fig1_query(n_servers=3)
    inputs = fig1_inputs(n_servers=3, duration_s=duration, period_s=0.5)
    join = "correlate"  # the Join of Fig. 1
    target = {"operator": (join, 0), "repair": (join, 0), "entry": ("entry", 0),
              "application": (q.sinks[0], 1)}.get(case)
    with rs.deploy(q, servers=SERVERS, k=2, app_replicas=2 if case == "application" else 1,
                   suspect_after_s=suspect_after, fail_after_s=fail_after, repair=case == "repair",
                   spares=1 if case == "repair" else 0) as dep:
        stop_at = {}

        def stopper():
            time.sleep(wall / 3)
            op, i = target
            label = f"{op}#{i}"
            stop_at["wall"] = time.time()
            stop_at["pid"] = dep.stop_replica(op, i)
            stop_at["label"] = label

        t = time.time()
        if target is not None:
            threading.Thread(target=stopper, daemon=True).start()
        res = dep.run(inputs, pace=duration / wall, timeout=max(120, 6 * wall))
        run_s = time.time() - t
        events = list(dep.events)
        slowest = {k: v for k, v in dep.detector.slowest_answers().items() if k != stop_at.get("label")}
    ref = run_reference(q, inputs)
    exact = True
    for app in q.sinks:
        try:
            assert_same_output(ref.outputs[app], res.outputs[app])
        except AssertionError:
            exact = False
    out = {"case": case, "wall_s": round(run_s, 3), "exact": exact, "complete": res.complete,
           "slowest_probe_answer_s": round(max(slowest.values(), default=0.0), 3)}
    app = q.sinks[0]
    arr, lat = res.latencies(app)
    if len(lat):
        lat = np.asarray(lat, dtype=float) * 1000.0
        cut = (stop_at.get("wall", t + wall / 3) - (t + 0.05))  # arrivals are seconds since the run's start
        before, after = lat[arr < cut], lat[arr >= cut]
        out["p99_before_ms"] = float(np.percentile(before, 99)) if len(before) else None
        out["p99_after_ms"] = float(np.percentile(after, 99)) if len(after) else None
    if "wall" in stop_at:
        dec = [e for e in events if e.get("event") == "declared_failed" and e.get("actor") == stop_at["label"]]
        sus = [e for e in events if e.get("event") == "suspected" and e.get("actor") == stop_at["label"]]
        out["stopped"] = stop_at["label"]
        # event times are seconds since the deployment's t0; convert the stop to the same clock
        stop_rel = next((e["t"] for e in events if e.get("event") == "stopped"), None)
        out["declared_after_s"] = round(dec[0]["t"] - stop_rel, 3) if dec and stop_rel is not None else None
        fixed = [e for e in events if e.get("event") == "repaired" and e.get("actor") == stop_at["label"]]
        if case == "repair":
            out["repaired_after_declared_s"] = round(fixed[0]["t"] - dec[0]["t"], 3) if fixed and dec else None
        out["suspected_after_s"] = round(sus[0]["t"] - stop_rel, 3) if sus and stop_rel is not None else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wall", type=float, default=30.0, help="wall seconds each run lasts (default 30)")
    ap.add_argument("--duration", type=float, default=60.0, help="event seconds of input (default 60)")
    ap.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    ap.add_argument("--fail-after", type=float, default=None, help="fail_after_s (default: deploy()'s)")
    ap.add_argument("--suspect-after", type=float, default=None, help="suspect_after_s (default: deploy()'s)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 12 s of wall, 24 s of input")
    ap.add_argument("--json", help="write every run's figures here")
    a = ap.parse_args(argv)
    if a.wall <= 3 or a.duration <= 0:
        ap.error("--wall must be > 3 seconds and --duration > 0")
    if a.quick:
        a.wall, a.duration = 12.0, 24.0
    from replistream.engines.ray import init_ray
    from replistream.engines.ray.detector import DEFAULT_FAIL_AFTER_S, DEFAULT_SUSPECT_AFTER_S

    fail_after = a.fail_after or DEFAULT_FAIL_AFTER_S
    suspect_after = a.suspect_after or min(DEFAULT_SUSPECT_AFTER_S, fail_after)
    init_ray()
    rows = []
    for case in a.cases:
        print(f"[slowness] {case} ...", file=sys.stderr, flush=True)
        rows.append(run_case(case, a.wall, a.duration, fail_after, suspect_after))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    healthy = next((r["wall_s"] for r in rows if r["case"] == "healthy"), None)
    ok = all(r["exact"] and r["complete"] for r in rows)
    print(f"{'PASS' if ok else 'FAIL'}: {len(rows)} runs, every output exact: {ok}")
    print(f"{'case':<12} {'wall s':>7} {'x healthy':>9} {'p99 before':>10} {'p99 after':>9} {'suspected':>9} "
          f"{'declared':>8} {'repaired':>8} exact")
    for r in rows:
        ratio = "" if healthy is None else f"{r['wall_s'] / healthy:.2f}"
        f = lambda v, d=0: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
        print(f"{r['case']:<12} {r['wall_s']:>7.2f} {ratio:>9} {f(r.get('p99_before_ms')):>10} "
              f"{f(r.get('p99_after_ms')):>9} {f(r.get('suspected_after_s'), 2):>9} {f(r.get('declared_after_s'), 2):>8}"
              f" {f(r.get('repaired_after_declared_s'), 2):>8} {r['exact']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
                       "cpus": os.cpu_count(), "load": os.getloadavg(), "wall": a.wall, "duration": a.duration,
                       "fail_after_s": fail_after, "suspect_after_s": suspect_after, "runs": rows}, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Repair time on Ray: from a replica's crash to the first output of its replacement
(``deploy(repair=True)``; issue #18; a benchmark, not a test).

    python bench/repair.py                       # 10 runs each: announced kill / unannounced crash, 0 / 1 spare
    python bench/repair.py --runs 3 --quick      # a smoke run
    python bench/repair.py --json out.json       # also write every run's figures

Each run deploys a keyed tumbling count (``--keys`` keys, 1 s windows) with k=2 on three
local servers, feeds ``--seconds`` of event time paced at ``--pace`` (event seconds per wall
second), and at 40% of the stream takes replica 0 of the window away, either

* ``kill``: ``dep.kill_replica`` (the deployment knows at once), or
* ``crash``: ``ray.kill`` behind the deployment's back (found by its senders' failed calls or
  the driver's liveness check).

With ``repair=True`` the deployment replaces it on its server by hand-over from the live
peer (a warm spare's process with ``spares=1``; with ``spares=0`` the actor pool is emptied
before each run, so the replacement starts a process). Per run it records, in seconds:

* ``detect``: from the crash to the deployment marking the replica failed;
* ``repair``: from detection to the replacement's first output (its ``first_output_wall``),
  which is what issue #18 asks for;
* ``total``: crash to first output.

Every run's output is compared with the reference run (exact, as a multiset); a run that
differs makes the script exit 1. Medians and maxima go to stdout as a table.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SERVERS = ["boston", "london", "tokyo"]
S = 1_000_000


def make(keys: int, seconds: int, rate: int, seed: int):
    from replistream import Query

    q = Query("repair")
    s = q.source("s", {"k": "i8"}, punctuate_every=S // 10)
    s.window(size=S, by="k", aggs={"n": "count"}, name="per_k").sink("out")
    q.build()
    rng = np.random.default_rng(seed)
    n = seconds * rate
    ts = np.sort(rng.integers(0, seconds * S, n))
    k = rng.integers(0, keys, n)
    step = max(1, rate // 20)  # 50 ms of event time per chunk
    return q, [{"ts": ts[a:a + step], "k": k[a:a + step]} for a in range(0, n, step)]


def one(q, chunks, ref, how: str, spares: int, pace: float, at: int) -> dict:
    import ray

    from replistream import deploy
    from replistream.engines.ray import pool
    from replistream.sources import Call, inject_at
    from replistream.testing import assert_same_output

    t_crash = {}

    def take_away(d):
        t_crash["wall"] = time.time()
        if how == "kill":
            d.kill_replica("per_k", 0)
        else:
            ray.kill(d.topology.handle("per_k#0"), no_restart=True)

    data = inject_at(chunks, at, Call(take_away))
    pool.clear_pool()  # no process kept from the last run: without a spare, the replacement starts one
    with deploy(q, servers=SERVERS, k=2, repair=True, spares=spares) as dep:
        res = dep.run({"s": data}, pace=pace, timeout=600)
        end = time.time() + 60  # a repair may finish after the run's last result
        while not any(r["replica"] == "per_k#0" for r in dep.repairs) and time.time() < end:
            time.sleep(0.05)
        rec = next((r for r in dep.repairs if r["replica"] == "per_k#0"), None)
        first = None
        if rec and rec.get("repaired"):
            first = ray.get(dep.topology.handle(rec["new"]).stats.remote())["first_output_wall"]
    try:
        assert_same_output(ref.outputs["out"], res.outputs["out"])
        exact = True
    except AssertionError:
        exact = False
    out = {"how": how, "spares": spares, "exact": exact, "repaired": bool(rec and rec.get("repaired"))}
    if out["repaired"] and first is not None:
        out.update(detect=rec["detected_wall"] - t_crash["wall"], repair=first - rec["detected_wall"],
                   total=first - t_crash["wall"], install=rec["installed_wall"] - rec["detected_wall"])
    else:
        out["why"] = (rec or {}).get("why", "no repair recorded")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per case (default 10)")
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rate", type=int, default=20_000, help="tuples per event second (default 20000)")
    ap.add_argument("--seconds", type=int, default=10, help="event seconds per run (default 10)")
    ap.add_argument("--pace", type=float, default=2.0, help="event seconds per wall second (default 2)")
    ap.add_argument("--quick", action="store_true", help="6 event seconds, 2000 keys")
    ap.add_argument("--json", metavar="PATH", help="also write every run's figures here")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error("--runs must be >= 1")
    if a.quick:
        a.seconds, a.keys = 6, 2_000
    from replistream.engines.ray import init_ray
    from replistream.testing import run_reference

    load0 = os.getloadavg()
    init_ray()
    q, chunks = make(a.keys, a.seconds, a.rate, seed=18)
    ref = run_reference(q, {"s": chunks})
    at = int(0.4 * a.seconds * S)
    runs = []
    cases = [(how, spares) for how in ("kill", "crash") for spares in (0, 1)]
    for i in range(a.runs):
        for how, spares in cases:
            r = one(q, chunks, ref, how, spares, a.pace, at)
            r["run"] = i
            runs.append(r)
            fig = f"total {r['total']:.3f} s" if "total" in r else f"not repaired: {r['why']}"
            print(f"  run {i} {how:5s} spares={spares}: {fig}; exact={r['exact']}", file=sys.stderr, flush=True)
    print(f"{'case':18s} {'runs':>4s} {'detect med/max':>16s} {'repair med/max':>16s} {'total med/max':>16s}")
    for how, spares in cases:
        rs = [r for r in runs if r["how"] == how and r["spares"] == spares and "total" in r]
        if not rs:
            print(f"{how} spares={spares}: no repair measured")
            continue
        col = lambda k: f"{np.median([r[k] for r in rs]):.3f}/{max(r[k] for r in rs):.3f}"  # noqa: E731
        print(f"{how + ' spares=' + str(spares):18s} {len(rs):4d} {col('detect'):>16s} {col('repair'):>16s} "
              f"{col('total'):>16s}")
    ok = all(r["exact"] and r["repaired"] for r in runs)
    print(f"every run exact and repaired: {ok}; load before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
          f"{platform.node()} {os.cpu_count()} cpus")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": runs, "loadavg_before": load0, "loadavg_after": os.getloadavg(),
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

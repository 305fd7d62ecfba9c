"""How long a deployment runs without its coordinator (issue #29): a benchmark, not a test.

    python bench/coordinator_loss.py                  # 2 runs per way of losing it, a table
    python bench/coordinator_loss.py --runs 3 --json --out docs/experiments/coordinator_loss.json

Each run deploys a keyed window query (k=2, 3 servers, repair on), replays 16 s of input paced
x4, and loses the coordinator 5 event seconds in: ``ray.kill`` (no restart), SIGKILL of its
process, or SIGSTOP (it stops answering; the deployment fences it after its deadline (fail_after_s, at least 4 s)).
Measured: the seconds from the loss to the new coordinator answering (the deployment's
``coordinator_replaced`` event), how long the replacement itself took, and whether the output
equals the reference run. One Ray instance for every run (as a user's script would have).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import time

import numpy as np


def query():
    from replistream import Query, seconds

    q = Query("coordinator_loss")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(2), by="k", aggs={"n": "count", "sv": ("v", "sum")}, name="per_k").sink("out")
    return q.build()


def inputs(n=3000, span_s=16, chunk=50, seed=1):
    from replistream import seconds

    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(span_s), n))
    k, v = rng.integers(0, 8, n), rng.normal(size=n)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, n, chunk)]}


def one(how: str) -> dict:
    import ray

    from replistream import deploy
    from replistream.sources import Call, inject_at
    from replistream.testing import as_multiset, run_reference

    q, data = query(), inputs()
    ref = run_reference(q, data)
    lost = {}

    def lose(dep):
        lost["t"] = dep.now()
        if how == "ray.kill":
            ray.kill(dep.coordinator)
        else:
            os.kill(dep._coordinator_pid, signal.SIGKILL if how == "SIGKILL" else signal.SIGSTOP)

    s = inject_at(data["s"], 5_000_000, Call(lose))
    with deploy(q, servers=["boston", "london", "tokyo"], k=2, repair=True, progress=False) as dep:
        res = dep.run({"s": s}, pace=4.0, timeout=180)
    (ev,) = [e for e in res.events if e.get("event") == "coordinator_replaced"]
    exact = res.complete and as_multiset(res.outputs["out"]) == as_multiset(ref.outputs["out"])
    return {"how": how, "to_replaced_s": round(ev["t"] - lost["t"], 3), "replace_s": ev["seconds"], "exact": exact}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="write the record (date, machine, load, command, figures) here")
    args = ap.parse_args()
    from replistream.engines.ray import init_ray

    init_ray()
    load = os.getloadavg()[0]
    rows = [one(how) for how in ("ray.kill", "SIGKILL", "SIGSTOP") for _ in range(args.runs)]
    figures = {}
    for how in ("ray.kill", "SIGKILL", "SIGSTOP"):
        xs = [r["to_replaced_s"] for r in rows if r["how"] == how]
        figures[f"{how}: loss to new coordinator"] = f"{min(xs):.2f}-{max(xs):.2f} s" if len(xs) > 1 else f"{xs[0]:.2f} s"
        figures[f"{how}: replacement itself (median)"] = f"{statistics.median(r['replace_s'] for r in rows if r['how'] == how):.2f} s"
    rec = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()})",
           "load": round(load, 2), "command": "python bench/coordinator_loss.py " + " ".join(
               a for a in ("--runs", str(args.runs), "--json" if args.json else "") if a),
           "figures": figures, "runs": rows, "all_exact": all(r["exact"] for r in rows)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)
    if args.json:
        print(json.dumps(rec))
    else:
        print(f"{'how':10} {'loss -> new coordinator':>24} {'replacement':>12} exact")
        for r in rows:
            print(f"{r['how']:10} {r['to_replaced_s']:>22.2f} s {r['replace_s']:>10.2f} s {r['exact']}")
    return 0 if rec["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

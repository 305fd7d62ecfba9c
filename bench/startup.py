"""Where deployment start-up goes (issue #16): a benchmark, not a test.

    python bench/startup.py                 # 3 fresh processes per setting, a table
    python bench/startup.py --runs 5 --json

Each run is a fresh Python process (a fresh local Ray), timed in phases:

* ``import``: ``import replistream`` (and the Ray engine's module);
* ``ray``: ``init_ray()``, the local Ray instance (GCS, raylet, the driver's connection);
* ``deploy``: ``deploy(query, servers=4, k=K)`` until every actor is up and every stream
  replica connected (``deploy`` returns then);
* ``run``: ``dep.run()`` of 2,000 tuples in one chunk, to END at the application and the
  results collected (an upper bound on the first tuple's way through the pipeline);
* ``again``: a second ``deploy`` of the same query in the same process, to the same point
  as ``deploy`` (Ray already up).

With ``--cluster`` the same fresh processes also join a cluster that is already running
(``replistream up``; prestart ``cluster``): ``ray`` is then the time to connect, and the
deployment takes its actors from the cluster's warm pool (engines/ray/warm.py), full again
before each run (the steady state of a cluster that runs scripts now and then).

The query is a filter and a keyed count window over one source; its output is checked
against a numpy computation. Settings: ``k`` (1 and 3) and ``prestart`` (``init_ray(num_cpus=N)``
with N the number of actors, so the raylet starts N Python worker processes as it starts,
while the driver goes on; the actors ask for no CPU, so N changes nothing else).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import replistream as rs
from replistream.engines.ray import deploy, init_ray
t_import = time.perf_counter()
k, prestart, address = int(sys.argv[1]), int(sys.argv[2]), (sys.argv[3] if len(sys.argv) > 3 else None)
if address:  # a cluster already running (replistream up): joined, not started
    init_ray(address=address)
else:
    init_ray(**({"num_cpus": prestart} if prestart else {}))
t_ray = time.perf_counter()
q = rs.Query()
s = q.source("events", {"key": "i8", "x": "f8"})
s.filter(lambda t: t["x"] >= 0.5, name="big").window(1_000_000, by="key", aggs={"n": "count"}, name="per_key").sink("out")
q = q.build()
rng = np.random.default_rng(0)
n = 2000
data = np.zeros(n, dtype=[("ts", "i8"), ("key", "i8"), ("x", "f8")])
data["ts"] = np.arange(n) * 1000
data["key"] = rng.integers(0, 10, n)
data["x"] = rng.random(n)
dep = deploy(q, servers=4, k=k, network="zero")
t_deploy = time.perf_counter()
res = dep.run({"events": [data]}, timeout=120)
t_run = time.perf_counter()
big = data[data["x"] >= 0.5]
expected = {}
for ts, key in zip(big["ts"] // 1_000_000, big["key"]):
    expected[(int(ts), int(key))] = expected.get((int(ts), int(key)), 0) + 1
got = {(int(w) // 1_000_000, int(kk)): int(c) for w, kk, c in
       zip(res.outputs["out"]["window_start"], res.outputs["out"]["key"], res.outputs["out"]["n"])}
actors = len(dep.handles)
dep.shutdown()
t1 = time.perf_counter()
dep2 = deploy(q, servers=4, k=k, network="zero")
t_again = time.perf_counter() - t1
dep2.shutdown()
print(json.dumps({"k": k, "prestart": prestart, "actors": actors, "import": t_import - t0, "ray": t_ray - t_import,
                  "deploy": t_deploy - t_ray, "run": t_run - t_deploy, "total": t_run - t0,
                  "again": t_again, "correct": got == expected}))
"""


def run_one(k: int, prestart: int, address: str | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(k), str(prestart), *([address] if address else [])],
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"k={k} prestart={prestart} failed:\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per setting (default 3)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cluster", action="store_true",
                    help="also time fresh processes that join a running cluster (prestart 'cluster'): one started "
                         "here with `replistream up` (stopped at the end) unless one is recorded or RAY_ADDRESS is set")
    ap.add_argument("--cluster-only", action="store_true", help="only the runs that join a cluster (implies --cluster)")
    args = ap.parse_args(argv)
    args.cluster = args.cluster or args.cluster_only
    load = os.getloadavg()[0]
    rows = []
    for k in (1, 3):
        actors = 1 + 3 * k  # entry points, filter, window, application
        for prestart in () if args.cluster_only else (0, actors):
            for i in range(args.runs):
                r = run_one(k, prestart)
                rows.append(r)
                print(f"k={k} prestart={prestart or '-'} run {i}: total {r['total']:.2f} s", file=sys.stderr)
    if args.cluster:
        from replistream.engines.ray import cluster
        from replistream.engines.ray.host import cluster_address

        started = cluster_address() is None
        if started:
            print("starting a cluster (replistream up) ...", file=sys.stderr)
            cluster.up()
        address = cluster_address()
        try:
            for k in (1, 3):
                for i in range(args.runs + 1):  # the first run after `up` warms the cluster's caches: not counted
                    cluster.start_warm_pool(address, wait=True)  # a cluster already running: its warm pool full again
                    r = run_one(k, 0, address)
                    r["prestart"] = "cluster"
                    if i > 0 or not started:
                        rows.append(r)
                    print(f"k={k} cluster run {i}{' (warm-up, not counted)' if i == 0 and started else ''}: "
                          f"total {r['total']:.2f} s", file=sys.stderr)
        finally:
            if started:
                cluster.down()
    if args.json:
        print(json.dumps({"load_before": load, "rows": rows}))
        return 0
    print(f"load average before: {load:.2f}; medians of {args.runs} fresh processes, seconds")
    print(f"{'k':>2} {'prestart':>8} {'import':>7} {'ray':>6} {'deploy':>7} {'run':>6} {'total':>6} {'again':>6}  correct")
    for k in (1, 3):
        for prestart in sorted({r["prestart"] for r in rows if r["k"] == k}, key=str):
            sel = [r for r in rows if r["k"] == k and r["prestart"] == prestart]
            med = {f: sorted(r[f] for r in sel)[len(sel) // 2] for f in ("import", "ray", "deploy", "run", "total",
                                                                         "again")}
            print(f"{k:>2} {prestart or '-':>8} {med['import']:>7.2f} {med['ray']:>6.2f} {med['deploy']:>7.2f} "
                  f"{med['run']:>6.2f} {med['total']:>6.2f} {med['again']:>6.2f}  "
                  f"{all(r['correct'] for r in sel)}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

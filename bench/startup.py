"""Where deployment start-up goes (issues #16 and #42): a benchmark, not a test.

    python bench/startup.py                 # 3 fresh processes per setting, the budget line by line
    python bench/startup.py --runs 5 --json
    python bench/startup.py --import-only   # `import replistream` alone, 7 fresh processes

Each run is a fresh Python process (a fresh local Ray), timed in phases:

* ``import replistream``: ``import replistream`` alone (budget 0.5 s, issue #42 point 4);
* ``Ray's own import``: ``import ray`` after it (``ray_import`` in the JSON), counted apart;
* ``import the Ray engine``: ``from replistream.engines.ray import deploy, init_ray`` after that
  (``import_engine``; ``import`` in the JSON is the three imports together, as before);
* ``Ray's own start``: ``init_ray()``, the local Ray instance (GCS, raylet, the driver's
  connection), counted apart from the budget (``ray`` in the JSON, as before);
* ``deploy``: ``deploy(query, servers=4, k=K)`` until every actor is up and every stream
  replica connected (``deploy`` returns then);
* ``run``: ``dep.run()`` of 2,000 tuples in one chunk, to END at the application and the
  results collected (an upper bound on the first result's way through the pipeline);
* ``again``: a second ``deploy`` of the same query in the same process, to the same point
  as ``deploy`` (Ray already up; budget 1 s once actors are warm).

With ``--cluster`` the same fresh processes also join a cluster that is already running
(``replistream up``; prestart ``cluster``): ``ray`` is then the time to connect, and the
deployment takes its actors from the cluster's warm pool (engines/ray/warm.py), full again
before each run (the steady state of a cluster that runs scripts now and then).

The query is a filter and a keyed count window over one source; its output is checked
against a numpy computation. Settings: ``k`` (1 and 3) and ``prestart`` (``init_ray(num_cpus=N)``
with N the number of actors, so the raylet starts N Python worker processes as it starts,
while the driver goes on; the actors ask for no CPU, so N changes nothing else).

With ``--detached`` (on the cluster; nothing else is timed), fresh processes deploy the same
query detached (``deploy(..., name=, detached=True)`` with a ``ParquetSink``), feed it and wait
for the end of the stream: ``deploy() + feed()`` is what the script waits for (target 5 s, issue
#40); the output in the sink's files is checked.

With ``--import-only``, each fresh process only imports replistream (timed with
``time.perf_counter`` inside the process, so the interpreter's own start is not counted) and
reports which heavy libraries the import loaded (there should be none).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import replistream as rs
t_rs = time.perf_counter()
import ray  # Ray's own import (the engine's deploy would import it): timed apart, part of Ray's own start
t_ray_import = time.perf_counter()
from replistream.engines.ray import deploy, init_ray
t_import = time.perf_counter()
import numpy as np  # already imported by replistream: free here
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
print(json.dumps({"k": k, "prestart": prestart, "actors": actors, "import": t_import - t0,
                  "import_replistream": t_rs - t0, "ray_import": t_ray_import - t_rs,
                  "import_engine": t_import - t_ray_import, "ray": t_ray - t_import,
                  "deploy": t_deploy - t_ray, "run": t_run - t_deploy, "total": t_run - t0,
                  "again": t_again, "correct": got == expected}))
"""


DETACHED_CHILD = r"""
import json, os, sys, tempfile, time, uuid
t0 = time.perf_counter()
import replistream as rs
from replistream import ParquetSink
import numpy as np
k, address = int(sys.argv[1]), sys.argv[2]
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
out = tempfile.mkdtemp(prefix="startup-detached-")
t_import = time.perf_counter()
dep = rs.deploy(q, servers=4, k=k, network="zero", name="startup-" + uuid.uuid4().hex[:8], detached=True,
                address=address, sinks={"out": ParquetSink(out)}, progress=False)
t_deploy = time.perf_counter()
dep.feed({"events": [data]})
t_feed = time.perf_counter()
try:
    ok = dep.wait(120)
    t_done = time.perf_counter()
finally:
    dep.stop()
rows = ParquetSink(out).read()
big = data[data["x"] >= 0.5]
expected = {}
for ts, key in zip(big["ts"] // 1_000_000, big["key"]):
    expected[(int(ts), int(key))] = expected.get((int(ts), int(key)), 0) + 1
got = {(int(w) // 1_000_000, int(kk)): int(c) for w, kk, c in zip(rows["window_start"], rows["key"], rows["n"])}
print(json.dumps({"k": k, "import": t_import - t0, "deploy": t_deploy - t_import, "feed": t_feed - t_deploy,
                  "deploy_feed": t_feed - t_import, "to_done": t_done - t_import, "total": t_feed - t0,
                  "correct": bool(ok) and got == expected}))
"""


def run_detached(k: int, address: str) -> dict:
    """A fresh process that deploys detached on the running cluster, feeds, waits for the end of the
    stream (results in a ParquetSink) and stops the deployment."""
    out = subprocess.run([sys.executable, "-c", DETACHED_CHILD, str(k), address], capture_output=True, text=True,
                         timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"detached k={k} failed:\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


#: Issue #40's target: a detached deploy() + feed() on a cluster from `replistream up`, seconds.
DETACHED_TARGET = 5.0


def print_detached(rows: list[dict]) -> None:
    for k in sorted({r["k"] for r in rows}):
        sel = [r for r in rows if r["k"] == k]
        print(f"k={k}, detached on a running cluster: medians of {len(sel)} fresh processes, seconds (min-max); "
              f"output correct: {all(r['correct'] for r in sel)}")
        for label, f, limit in [("import replistream (and build the query)", "import", None),
                                ("deploy(detached=True)", "deploy", None), ("feed()", "feed", None),
                                ("deploy() + feed()", "deploy_feed", DETACHED_TARGET),
                                ("deploy() to the end of the stream", "to_done", None)]:
            v = sorted(r[f] for r in sel)
            print(f"  {label:<46} {v[len(v) // 2]:>6.2f}  ({v[0]:.2f}-{v[-1]:.2f})  "
                  f"{_verdict(v[len(v) // 2], limit, 'target')}".rstrip())
        print()


def run_one(k: int, prestart: int, address: str | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(k), str(prestart), *([address] if address else [])],
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"k={k} prestart={prestart} failed:\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


IMPORT_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import replistream
t1 = time.perf_counter()
heavy = json.loads(sys.argv[1])
print(json.dumps({"import_replistream": t1 - t0, "file": replistream.__file__,
                  "heavy": [m for m in heavy if m in sys.modules]}))
"""
# what `import replistream` must not import (tests/core/test_import_budget.py checks the same)
HEAVY = ["networkx", "scipy", "pyarrow", "pandas", "ray", "pyspark", "raydp", "matplotlib", "rich", "tqdm", "numpy.ma"]

# The budgets and targets (issue #42, point 4 and "Targets"), in seconds.
IMPORT_BUDGET = 0.5
DEPLOY_WARM_BUDGET = 1.0
TOTAL_TARGET = {"fresh": 5.0, "cluster": 1.5}  # k=1; k=3 at most 1.5x k=1's


def run_import(runs: int, as_json: bool) -> int:
    """``import replistream`` in ``runs`` fresh processes (the current folder's replistream first, as for
    any ``python -c``: run from an exported tree to time another version)."""
    load = os.getloadavg()[0]
    rows = []
    for i in range(runs):
        out = subprocess.run([sys.executable, "-c", IMPORT_CHILD, json.dumps(HEAVY)], capture_output=True, text=True,
                             timeout=120)
        if out.returncode != 0:
            raise SystemExit(f"import run {i} failed:\n{out.stderr[-2000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"run {i}: import replistream {rows[-1]['import_replistream']:.3f} s", file=sys.stderr)
    times = sorted(r["import_replistream"] for r in rows)
    med = times[len(times) // 2]
    heavy = sorted({m for r in rows for m in r["heavy"]})
    if as_json:
        print(json.dumps({"load_before": load, "median": med, "rows": rows}))
    else:
        print(f"load average before: {load:.2f}; {runs} fresh processes of {rows[0]['file']}")
        print(f"import replistream: median {med:.3f} s (min {times[0]:.3f}, max {times[-1]:.3f}); "
              f"budget {IMPORT_BUDGET} s: {'met' if med < IMPORT_BUDGET else 'NOT met'}")
        print(f"heavy libraries imported: {', '.join(heavy) if heavy else 'none'}")
    return 0 if med < IMPORT_BUDGET and not heavy else 1


def _verdict(value: float, limit: float | None, word: str = "budget") -> str:
    if limit is None:
        return ""
    return f"{word} {limit:.1f}: {'met' if value <= limit else 'over by %.2f' % (value - limit)}"


def print_budget(rows: list[dict]) -> None:
    """The start-up budget of each setting, a line per phase: median (min-max) over the fresh processes,
    against the issue's budget or target where it sets one (k=3's total: 1.5x k=1's in the same setting)."""
    def med(sel, f):
        v = sorted(r[f] for r in sel)
        return v[len(v) // 2], v[0], v[-1]

    def kind(prestart):
        return "cluster" if prestart == "cluster" else ("prestart" if prestart else "fresh")

    k1_total = {}
    for k in (1, 3):
        for prestart in sorted({r["prestart"] for r in rows if r["k"] == k}, key=str):
            sel = [r for r in rows if r["k"] == k and r["prestart"] == prestart]
            cluster = kind(prestart) == "cluster"
            where = ("joining a running cluster" if cluster else
                     f"Ray started here{f', {prestart} workers prestarted' if prestart else ''}")
            if k == 1:
                k1_total[kind(prestart)] = med(sel, "total")[0]
                total_limit = TOTAL_TARGET["cluster" if cluster else "fresh"]
            else:
                base = k1_total.get(kind(prestart))
                total_limit = 1.5 * base if base is not None else None
            lines = [
                ("import replistream", "import_replistream", IMPORT_BUDGET),
                ("Ray's own import (import ray), counted apart", "ray_import", None),
                ("import the Ray engine (after ray)", "import_engine", None),
                ("Ray's own start" + (" (init_ray: connect)" if cluster else " (init_ray)") + ", counted apart",
                 "ray", None),
                (f"deploy ({sel[0]['actors']} actors" + (", warm pool)" if cluster else ")"), "deploy",
                 DEPLOY_WARM_BUDGET if cluster else None),
                ("run: 2,000 tuples to the first results", "run", None),
                ("total" + (" (target: 1.5x k=1's)" if k == 3 else ""), "total", total_limit),
                ("a second deploy, same process (warm)", "again", DEPLOY_WARM_BUDGET),
            ]
            print(f"k={k}, {where}: medians of {len(sel)} fresh processes, seconds (min-max); "
                  f"output correct: {all(r['correct'] for r in sel)}")
            for label, f, limit in lines:
                if not all(f in r for r in sel):  # rows from before these fields
                    continue
                m, lo, hi = med(sel, f)
                word = "target" if f == "total" else "budget"
                print(f"  {label:<46} {m:>6.2f}  ({lo:.2f}-{hi:.2f})  {_verdict(m, limit, word)}".rstrip())
            print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=None,
                    help="fresh processes per setting (default 3; 7 with --import-only)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cluster", action="store_true",
                    help="also time fresh processes that join a running cluster (prestart 'cluster'): one started "
                         "here with `replistream up` (stopped at the end) unless one is recorded or RAY_ADDRESS is set")
    ap.add_argument("--cluster-only", action="store_true", help="only the runs that join a cluster (implies --cluster)")
    ap.add_argument("--detached", action="store_true",
                    help="only time a detached deploy() + feed() from fresh processes on a running cluster")
    ap.add_argument("--import-only", action="store_true",
                    help="only time `import replistream` (and list the heavy libraries it loads), no Ray")
    args = ap.parse_args(argv)
    if args.runs is not None and args.runs < 1:
        ap.error(f"--runs must be at least 1, not {args.runs}")
    if args.import_only:
        if args.cluster or args.cluster_only:
            ap.error("--import-only starts no Ray: drop --cluster/--cluster-only, or --import-only")
        return run_import(args.runs or 7, args.json)
    args.runs = args.runs or 3
    args.cluster = args.cluster or args.cluster_only or args.detached
    detached_rows: list[dict] = []
    load = os.getloadavg()[0]
    rows = []
    for k in (1, 3):
        actors = 1 + 3 * k  # entry points, filter, window, application
        for prestart in () if args.cluster_only or args.detached else (0, actors):
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
            for k in () if args.detached else (1, 3):
                for i in range(args.runs + 1):  # the first run after `up` warms the cluster's caches: not counted
                    cluster.start_warm_pool(address, wait=True)  # a cluster already running: its warm pool full again
                    r = run_one(k, 0, address)
                    r["prestart"] = "cluster"
                    if i > 0 or not started:
                        rows.append(r)
                    print(f"k={k} cluster run {i}{' (warm-up, not counted)' if i == 0 and started else ''}: "
                          f"total {r['total']:.2f} s", file=sys.stderr)
            for k in (1, 3) if args.detached else ():
                for i in range(args.runs + int(started)):  # (after `up`, a first run warms the caches: not counted)
                    cluster.start_warm_pool(address, wait=True)
                    r = run_detached(k, address)
                    warm_up = started and i == 0
                    if not warm_up:
                        detached_rows.append(r)
                    print(f"k={k} detached run {i}{' (warm-up, not counted)' if warm_up else ''}: deploy() + feed() "
                          f"{r['deploy_feed']:.2f} s", file=sys.stderr)
        finally:
            if started:
                cluster.down()
    if args.json:
        print(json.dumps({"load_before": load, "rows": rows, "detached": detached_rows}))
        return 0
    print(f"load average before: {load:.2f}; the start-up budget, phase by phase")
    if rows:
        print_budget(rows)
    print_detached(detached_rows)
    return 0 if all(r["correct"] for r in rows + detached_rows) else 1


if __name__ == "__main__":
    sys.exit(main())

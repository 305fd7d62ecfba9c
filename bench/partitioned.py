"""Partitioned operators (issue #41): throughput at p = 1 and p = 2 partitions, k = 1, each setting
in a fresh Python process as a user's script runs it. A benchmark, not a test.

    python bench/partitioned.py                          # both workloads, a table
    python bench/partitioned.py --out docs/experiments/partitioned.json

Workloads:

* ``cpu``: a CPU-heavy map (``--rounds`` passes of numpy trigonometry per tuple) keyed by ``k``,
  feeding a keyed 1 s count and sum, inputs built in the process (not timed) and given to
  ``dep.run()``; ``parallelism={"heavy": p, "per_key": p}``. Output compared with the reference
  run (``run_reference``) of the same query and input.
* ``w2``: a keyed 1 s count of 10,000 keys at 20,000 events per event-time second, Parquet files
  in (``FileSource``, written beforehand, not timed) and a ``ParquetSink`` out;
  ``parallelism={"per_key": p}``. Output checked against a numpy count of the files.

``--split entry,app`` also partitions, at p > 1, the entry points (``parallelism={"entry": p}``:
each partition takes a share of the file chunks) and the application (``{"out": p}``: each
partition writes its own ParquetSink files).

Figures: ``run``: ``dep.run()`` alone (events / s); ``whole``: process start to exit; ``busy``: the
whole machine's CPU time during ``dep.run()`` over its wall time (cores busy: a run that keeps
every core busy cannot gain from more partitions on this machine); and the CPU
seconds the partitioned operators' replicas spent per million events (routing's cost shows as a
rise of it at p = 2).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

COMMON = r"""
import numpy as np
from replistream import Query, seconds

def cpu_query(rounds):
    q = Query("cpu")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    def heavy(b, rounds=rounds):
        v = b["v"].copy()
        for _ in range(rounds):
            v = np.sin(v) * 0.5 + np.cos(v * 1.1) * 0.5
        return {"k": b["k"], "v": v}
    (s.map(heavy, {"k": "i8", "v": "f8"}, name="heavy")
      .window(size=seconds(1), by="k", aggs={"n": "count", "total": ("v", "sum")}, name="per_key").sink("out"))
    return q.build()

def cpu_inputs(events, seed=11, chunk=10_000):
    rng = np.random.default_rng(seed)
    ts = np.arange(events, dtype=np.int64) * 50
    k, v = rng.integers(0, 1000, events), rng.normal(size=events)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, events, chunk)]}
"""

CHILD = COMMON + r"""
import json, os, sys, time
t0 = float(sys.argv[1])
import ray
from replistream import FileSource, ParquetSink, deploy
work, p, events, rounds, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
split = [x for x in sys.argv[8].split(",") if x] if len(sys.argv) > 8 else []

def busy_jiffies():
    # the whole machine's CPU time (user, nice, system, irq, softirq, steal) and its clock ticks
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
if work == "cpu":
    q = cpu_query(rounds)
    inputs = cpu_inputs(events)
    par = {"heavy": p, "per_key": p}
    sinks = {"out": ParquetSink(out, every=seconds(10))}
else:
    q = Query("w2")
    src = sys.argv[7]
    s = FileSource(src, time="ts").declare(q, "events", punctuate_every=seconds(1))
    s.window(size=seconds(1), by="key", aggs={"n": "count"}, name="per_key").sink("out")
    q = q.build()
    inputs = {"events": FileSource(src, time="ts")}
    par = {"per_key": p}
    sinks = {"out": ParquetSink(out, every=seconds(10))}
if p > 1:  # the stages that do not split by default: the entry points and the application
    par.update({"entry": p} if "entry" in split else {})
    par.update({"out": p} if "app" in split else {})
t_ready = time.time()
dep = deploy(q, servers=3, k=1, sinks=sinks, progress=False, parallelism=par)
t_deploy = time.time()
j0 = busy_jiffies()
res = dep.run(inputs, timeout=3600)
t_run = time.time()
busy_cores = (busy_jiffies() - j0) / os.sysconf("SC_CLK_TCK") / (t_run - t_deploy)
cpu, by_actor = 0.0, {}
for label, h in dep.handles.items():
    c = ray.get(h.stats.remote(), timeout=60)["cpu_seconds"]
    by_actor[label] = round(c, 2)
    if label.split(".")[0].split("#")[0] in par and label.split(".")[0].split("#")[0] not in ("entry", "out"):
        cpu += c
dep.shutdown()
t_end = time.time()
print(json.dumps({"deploy_s": t_deploy - t_ready, "run_s": t_run - t_deploy, "whole_s": t_end - t0,
                  "busy_cores": round(busy_cores, 2), "split": split,
                  "partitioned_cpu_s": cpu, "cpu_s_by_actor": by_actor, "complete": res.complete}))
"""


def ceiling(events: int, rounds: int) -> dict:
    """The most two processes can gain on this machine for the CPU-heavy map alone: the map's
    function over the workload's input in one process, then over its two halves in two processes
    at once (no Ray, no pipeline), as wall-clock seconds and their ratio."""
    import multiprocessing as mp

    scope: dict = {}
    exec(COMMON, scope)
    ctx = mp.get_context("fork")

    def work(lo: int, hi: int) -> None:
        q = scope["cpu_query"](rounds)
        fn = q.spec("heavy").fn
        for chunk in scope["cpu_inputs"](events)["s"][lo:hi]:
            fn({"k": chunk["k"], "v": chunk["v"]})

    n = len(scope["cpu_inputs"](events)["s"])
    t = time.perf_counter()
    def joined(ps) -> None:
        for p in ps:
            p.join(timeout=3600)
            if p.is_alive() or p.exitcode != 0:
                p.kill()
                raise RuntimeError(f"ceiling: a worker process did not finish within an hour (exit code {p.exitcode})")

    p = ctx.Process(target=work, args=(0, n))
    p.start()
    joined([p])
    one = time.perf_counter() - t
    t = time.perf_counter()
    ps = [ctx.Process(target=work, args=(0, n // 2)), ctx.Process(target=work, args=(n // 2, n))]
    for p in ps:
        p.start()
    joined(ps)
    two = time.perf_counter() - t
    return {"one_process_s": round(one, 3), "two_processes_s": round(two, 3), "speed_up": round(one / two, 3)}


def _w2_inputs(folder: str, events: int, per_file: int = 1_000_000, seed: int = 7) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    ts = np.arange(events, dtype=np.int64) * 50
    key = rng.integers(0, 10_000, events)
    for i, a in enumerate(range(0, events, per_file)):
        pq.write_table(pa.table({"ts": ts[a:a + per_file], "key": key[a:a + per_file]}),
                       os.path.join(folder, f"part-{i:04d}.parquet"))
    pairs, counts = np.unique((ts // 1_000_000) * 10_000 + key, return_counts=True)
    return {"rows": int(len(pairs)), "total": int(counts.sum())}


def _check(work: str, out: str, want) -> bool:
    from replistream import ParquetSink
    from replistream.testing import assert_same_output

    got = ParquetSink(out).read()
    if work == "w2":
        return (len(got), int(got["n"].sum())) == (want["rows"], want["total"])
    try:
        assert_same_output(want, got[list(want.dtype.names)].astype(want.dtype))
        return True
    except AssertionError as e:
        print(f"cpu: not the reference's output: {str(e)[:300]}", file=sys.stderr)
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="cpu,w2", help="workloads, comma-separated: cpu, w2")
    ap.add_argument("--cpu-events", type=int, default=400_000)
    ap.add_argument("--rounds", type=int, default=300, help="passes of the heavy map per tuple")
    ap.add_argument("--w2-events", type=int, default=2_000_000)
    ap.add_argument("--ps", default="1,2")
    ap.add_argument("--split", default="", help="at p > 1 also partition these stages, comma-separated: entry, app "
                    "(the entry points split the files; the application writes per partition)")
    ap.add_argument("--out", default=None, help="write the record (date, machine, load, command, figures) here")
    ap.add_argument("--ceiling", action="store_true",
                    help="first, the CPU-heavy map's function alone in one process and in two at once: the most "
                         "two partitions can gain on this machine")
    args = ap.parse_args()
    works = [w.strip() for w in args.work.split(",")]
    bad = [w for w in works if w not in ("cpu", "w2")]
    if bad:
        ap.error(f"unknown workload {bad[0]!r}; choose from cpu, w2")
    tmp = tempfile.mkdtemp(prefix="replistream-partitioned-")
    load = os.getloadavg()[0]
    rows = []
    ceil = None
    if args.ceiling:
        ceil = ceiling(args.cpu_events, args.rounds)
        print(f"ceiling: the heavy map's function alone, one process {ceil['one_process_s']:.2f} s, two at once "
              f"{ceil['two_processes_s']:.2f} s: {ceil['speed_up']:.2f}x", file=sys.stderr)
    for work in works:
        src = os.path.join(tmp, f"{work}-in")
        os.makedirs(src)
        if work == "w2":
            events = args.w2_events
            want = _w2_inputs(src, events)
        else:
            events = args.cpu_events
            from replistream.testing import run_reference

            scope: dict = {}
            exec(COMMON, scope)
            print(f"cpu: the reference run of {events:,} events ...", file=sys.stderr)
            want = run_reference(scope["cpu_query"](args.rounds), scope["cpu_inputs"](events)).outputs["out"]
        for p in [int(x) for x in args.ps.split(",")]:
            out = os.path.join(tmp, f"{work}-out-{p}")
            t0 = time.time()
            done = subprocess.run([sys.executable, "-c", CHILD, repr(t0), work, str(p), str(events), str(args.rounds),
                                   out, src, args.split], capture_output=True, text=True, timeout=3600)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            r = json.loads(done.stdout.strip().splitlines()[-1])
            r.update(work=work, p=p, events=events, exact=_check(work, out, want),
                     run_events_per_s=round(events / r["run_s"]),
                     cpu_s_per_million=round(r["partitioned_cpu_s"] / events * 1e6, 3))
            rows.append(r)
            print(f"  CPU s by actor: {r['cpu_s_by_actor']}", file=sys.stderr)
            print(f"{work} p={p}: run {r['run_s']:.2f} s ({r['run_events_per_s']:,} events/s), whole {r['whole_s']:.2f} s, "
                  f"partitioned operators' CPU {r['cpu_s_per_million']:.2f} s per million events, machine busy "
                  f"{r['busy_cores']:.2f} of {os.cpu_count()} cores during the run, exact {r['exact']}",
                  file=sys.stderr)
    figures = {}
    if ceil is not None:
        figures["ceiling: the heavy map alone, two processes / one"] = f"{ceil['speed_up']:.2f}x"
    for work in works:
        by_p = {r["p"]: r for r in rows if r["work"] == work}
        for p, r in by_p.items():
            figures[f"{work} p={p}: run-only"] = f"{r['run_events_per_s']:,} events/s"
            figures[f"{work} p={p}: CPU of the partitioned operators per million events"] = f"{r['cpu_s_per_million']:.2f} s"
            figures[f"{work} p={p}: machine busy during the run"] = f"{r['busy_cores']:.2f} of {os.cpu_count()} cores"
        if 1 in by_p and 2 in by_p:
            figures[f"{work}: run-only speed-up p=2 / p=1"] = f"{by_p[2]['run_events_per_s'] / by_p[1]['run_events_per_s']:.2f}x"
            figures[f"{work}: CPU per million events p=2 / p=1"] = \
                f"{by_p[2]['cpu_s_per_million'] / by_p[1]['cpu_s_per_million']:.2f}"
    rec = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()})",
           "load": round(load, 2), "command": "python " + " ".join(sys.argv), "figures": figures, "runs": rows,
           "all_exact": all(r["exact"] for r in rows)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)
    print("\n".join(f"{n}: {v}" for n, v in figures.items()))
    return 0 if rec["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

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

``--intrinsic`` (W2 only, no Ray): the window's replica logic alone (``ReplicaCore``: its duplicate
filter and the window) over the entry points' stream of the same events, in this process, once
whole (p = 1) and once routed to p partition cores (each fed its share of every batch and every
punctuation, as the deployment's routing does), timed with ``time.process_time`` per call: first
with warm caches, then with a pass over an array larger than the machine's last-level cache
(``--evict-mb``) before each call, as a replica meets its state after the other processes of a
busy machine ran between two of its batches. Routing's own cost shows in the warm ratio; the
cost of more, smaller calls on cold caches in the other.

``--split entry,app`` also partitions, at p > 1, the entry points (``parallelism={"entry": p}``:
each partition takes a share of the file chunks) and the application (``{"out": p}``: each
partition writes its own ParquetSink files).

Figures: ``run``: ``dep.run()`` alone (events / s); ``whole``: process start to exit; ``busy``: the
whole machine's CPU time during ``dep.run()`` over its wall time (cores busy: a run that keeps
every core busy cannot gain from more partitions on this machine); and the CPU
seconds the partitioned operators' replicas spent during ``dep.run()`` per million events (routing's
cost shows as a rise of it at p = 2; each replica's start-up, the same for every process and so
counted once more for each further partition, is left out: ``partitioned_cpu_s_with_startup`` in
the JSON keeps it).
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
def stats_now():  # each actor's CPU seconds since it started (its start-up included) and calls taken
    return {label: ray.get(h.stats.remote(), timeout=60) for label, h in dep.handles.items()}
def cpu_now():
    return {label: st["cpu_seconds"] for label, st in stats_now().items()}
cpu_before = cpu_now()
t_start = time.time()
j0 = busy_jiffies()
res = dep.run(inputs, timeout=3600)
t_run = time.time()
busy_cores = (busy_jiffies() - j0) / os.sysconf("SC_CLK_TCK") / (t_run - t_start)
stats_after = stats_now()
cpu_after = {label: st["cpu_seconds"] for label, st in stats_after.items()}
pushes = {label: st.get("pushes") for label, st in stats_after.items() if st.get("pushes") is not None}
cpu, cpu_all, by_actor = 0.0, 0.0, {}
for label, c in cpu_after.items():
    by_actor[label] = round(c - cpu_before[label], 2)  # during dep.run() only
    if label.split(".")[0].split("#")[0] in par and label.split(".")[0].split("#")[0] not in ("entry", "out"):
        cpu += c - cpu_before[label]
        cpu_all += c
dep.shutdown()
t_end = time.time()
print(json.dumps({"deploy_s": t_deploy - t_ready, "run_s": t_run - t_start, "whole_s": t_end - t0,
                  "busy_cores": round(busy_cores, 2), "split": split,
                  "partitioned_cpu_s": cpu, "partitioned_cpu_s_with_startup": cpu_all, "cpu_s_by_actor": by_actor, "pushes_by_actor": pushes, "complete": res.complete}))
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


def intrinsic(events: int, chunk: int, partitions: int, evict_mb: int, reps: int = 3) -> dict:
    """W2's window replica logic alone over ``events`` events cut in ``chunk``-row batches: CPU
    seconds per million events at p = 1 and at ``partitions`` (routed), with warm caches and with
    ``evict_mb`` MB streamed through before each call (best of ``reps``), and whether the routed
    partitions' counts equal the whole one's."""
    from replistream import Query, seconds
    from replistream.partition import BinMap, Router
    from replistream.replica.core import ReplicaCore
    from replistream.sources import source_streams

    q = Query("w2")
    q.source("events", {"key": "i8"}, punctuate_every=seconds(1)).window(
        size=seconds(1), by="key", aggs={"n": "count"}, name="per_key").sink("out")
    q = q.build()
    rng = np.random.default_rng(7)
    ts, key = np.arange(events, dtype=np.int64) * 50, rng.integers(0, 10_000, events)
    streams, _ = source_streams(q, {"events": [{"ts": ts[a:a + chunk], "key": key[a:a + chunk]}
                                               for a in range(0, events, chunk)]})
    items = streams["events"]
    router = Router(q, "per_key", BinMap.even(partitions))
    feeds = [[] for _ in range(partitions)]
    for it in items:
        if isinstance(it, np.ndarray):
            for i, part in enumerate(router.split(0, it)):
                if len(part):
                    feeds[i].append(part)
        else:
            for f in feeds:
                f.append(it)
    evict = np.ones(evict_mb * (1 << 20) // 8)

    def timed(plan: list[list], cold: bool) -> tuple[float, int]:
        best, total = float("inf"), 0
        for _ in range(reps):
            cores = [ReplicaCore(q, "per_key", [1]) for _ in plan]
            spent, total = 0.0, 0
            for core, feed in zip(cores, plan):
                for it in feed:
                    if cold:
                        np.add(evict, 1.0, out=evict)
                    t = time.process_time()
                    out = core.process(0, 0, it)
                    spent += time.process_time() - t
                    total += sum(int(o["n"].sum()) for o in out if isinstance(o, np.ndarray))
            best = min(best, spent)
        return best, total

    rec = {"events": events, "chunk": chunk, "partitions": partitions, "evict_mb": evict_mb,
           "calls": {"1": len(items), str(partitions): sum(len(f) for f in feeds)}}
    for cold in (False, True):
        (one, n1), (many, n2) = timed([items], cold), timed(feeds, cold)
        name = "cold" if cold else "warm"
        rec[name] = {"p1_s_per_million": round(one / events * 1e6, 3),
                     f"p{partitions}_s_per_million": round(many / events * 1e6, 3),
                     "ratio": round(many / one, 3), "counts_equal": n1 == n2 == events}
    return rec


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
    ap.add_argument("--intrinsic", action="store_true",
                    help="W2's window logic alone in this process (no Ray): p=1 against routed partitions, warm and "
                         "with the caches evicted before each call")
    ap.add_argument("--chunk", type=int, default=10_000, help="--intrinsic: rows per entry batch")
    ap.add_argument("--evict-mb", type=int, default=64,
                    help="--intrinsic: MB streamed through before each call in the cold run (more than the "
                         "last-level cache)")
    args = ap.parse_args()
    if args.intrinsic:
        p = max(int(x) for x in args.ps.split(","))
        if p < 2:
            ap.error(f"--intrinsic compares p=1 with more partitions; --ps {args.ps} has none above 1")
        print(f"intrinsic: W2's window logic, {args.w2_events:,} events in batches of {args.chunk:,}, p=1 and "
              f"p={p}, warm then cold (best of 3 each) ...", file=sys.stderr)
        r = intrinsic(args.w2_events, args.chunk, p, args.evict_mb)
        figures = {}
        for name in ("warm", "cold"):
            figures[f"intrinsic {name}: the window's CPU per million events, p={p} / p=1"] = f"{r[name]['ratio']:.2f}"
            figures[f"intrinsic {name}: p=1"] = f"{r[name]['p1_s_per_million']:.3f} s per million events"
        rec = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} ({os.cpu_count()} cores, "
               f"{platform.machine()})", "load": round(os.getloadavg()[0], 2), "command": "python " + " ".join(sys.argv),
               "figures": figures, "intrinsic": r,
               "all_exact": all(r[n]["counts_equal"] for n in ("warm", "cold"))}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rec, f, indent=1)
        print("\n".join(f"{n}: {v}" for n, v in figures.items()))
        return 0 if rec["all_exact"] else 1
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
            print(f"  CPU s by actor: {r['cpu_s_by_actor']}; calls taken (pushes) by actor: {r.get('pushes_by_actor')}",
                  file=sys.stderr)
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

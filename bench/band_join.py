"""The two-source band join on the user's path (issue #42 point 3): a benchmark, not a test.

    python bench/band_join.py                          # k = 1, sink and driver, a table
    python bench/band_join.py --ks 1,3 --out docs/experiments/band_join.json

The workload: two CSV sources, ``left`` and ``right``, each with half the events (1,000 keys,
5,000 events per event-time second per side, uniform times), joined on ``key`` where the two
timestamps are less than ``--window-ms`` apart (a band join; at the default 1 s, about five
output pairs per input event). The files are written beforehand (not timed). Each setting runs in
a fresh Python process, as a user's script does: ``import replistream``, ``deploy(q, servers=3,
k=K)``, ``dep.run({"left": FileSource(...), "right": FileSource(...)})``, results out, ``shutdown``.
Results either go to a ``ParquetSink`` written by the application replica (``sink``) or come back
through ``run()`` and are written with pandas (``driver``).

Reported per setting: ``run`` (``dep.run()`` alone: input events per second), ``whole`` (the
process from start to exit), the phases, and CPU seconds per million input events of every
replica process and of the driver. The output is checked against a numpy band join of the same
files (row count and the sum of output timestamps).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchrecord import record, write  # noqa: E402

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import replistream as rs
from replistream import FileSource, ParquetSink, Query, deploy, millis
k, mode, left, right, out, window_ms = sys.argv[1:7]
check = sys.argv[7:8] != ["nocheck"]  # nocheck: the output is not read back here (peers_w1 checks it outside)
q = Query("band")
L = FileSource(left, time="ts").declare(q, "left", punctuate_every=millis(100))
R = FileSource(right, time="ts").declare(q, "right", punctuate_every=millis(100))
L.join(R, window=millis(int(window_ms)), on="key", name="band").sink("pairs")
q = q.build()
sinks = {"pairs": ParquetSink(out)} if mode == "sink" else None
t_import = time.perf_counter()
dep = deploy(q, servers=3, k=int(k), sinks=sinks, progress=False)
t_deploy = time.perf_counter()
res = dep.run({"left": FileSource(left, time="ts"), "right": FileSource(right, time="ts")}, timeout=1800)
t_run = time.perf_counter()
if not check:
    rows = tsum = None
elif sinks:
    rows, tsum = int(sinks["pairs"].manifest()["rows"]), int(sinks["pairs"].read()["ts"].sum())
else:
    res.to_pandas("pairs").to_parquet(out + ".parquet")
    rows, tsum = len(res.outputs["pairs"]), int(res.outputs["pairs"]["ts"].sum())
t_out = time.perf_counter()
cpu = {label: a.get("cpu_seconds") for label, a in dep.metrics()["actors"].items()}
ru = resource.getrusage(resource.RUSAGE_SELF)
dep.shutdown()
t_end = time.perf_counter()
print(json.dumps({"import_s": t_import - t0, "deploy_s": t_deploy - t_import, "run_s": t_run - t_deploy,
                  "write_s": t_out - t_run, "shutdown_s": t_end - t_out, "rows": rows, "ts_sum": tsum,
                  "complete": res.complete, "cpu_s": cpu, "driver_cpu_s": ru.ru_utime + ru.ru_stime}))
"""


def write_inputs(folder: str, events: int, keys: int = 1000, rate: int = 5000, seed: int = 7) -> dict:
    """Two CSV files of ``events // 2`` rows each; returns where they are."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(seed)
    n = events // 2
    span = n * 1_000_000 // rate
    out = {}
    for side in ("left", "right"):
        ts = np.sort(rng.integers(0, span, n)).astype(np.int64)
        path = os.path.join(folder, side)
        os.makedirs(path)
        pacsv.write_csv(pa.table({"ts": ts, "key": rng.integers(0, keys, n), "v": rng.random(n)}),
                        os.path.join(path, "part-0000.csv"))
        out[side] = path
    return out


def expected(paths: dict, window_us: int) -> dict:
    """Rows and the sum of output timestamps of the band join, by numpy: per key, the right
    timestamps in ``(t - w, t + w)`` of each left one; an output's time is the later of the two."""
    import pyarrow.csv as pacsv

    side = {s: pacsv.read_csv(os.path.join(p, "part-0000.csv")).to_pandas() for s, p in paths.items()}
    rows, tsum = 0, 0
    right = {k: np.sort(g["ts"].to_numpy()) for k, g in side["right"].groupby("key")}
    for k, g in side["left"].groupby("key"):
        r = right.get(k)
        if r is None:
            continue
        csum = np.concatenate(([0], np.cumsum(r)))
        for t in g["ts"].to_numpy():
            lo, mid, hi = (np.searchsorted(r, t - window_us, "right"), np.searchsorted(r, t, "right"),
                           np.searchsorted(r, t + window_us, "left"))
            rows += int(hi - lo)
            tsum += int(t) * int(mid - lo) + int(csum[hi] - csum[mid])  # max(t, r): t below, r above
    return {"rows": rows, "ts_sum": tsum}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=360_000, help="input events, half per side")
    ap.add_argument("--window-ms", type=int, default=1000, help="the band: |left.ts - right.ts| < this")
    ap.add_argument("--ks", default="1")
    ap.add_argument("--modes", default="sink,driver")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the record (date, machine, load, command, figures) here")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= {"sink", "driver"}:
        ap.error(f"--modes takes sink and/or driver, got {args.modes!r}")
    work = tempfile.mkdtemp(prefix="replistream-band-join-")
    paths = write_inputs(work, args.events)
    want = expected(paths, args.window_ms * 1000)
    print(f"{args.events:,} events, {want['rows']:,} output pairs expected", file=sys.stderr)
    load = os.getloadavg()[0]
    runs = []
    for rep in range(args.repeat):
        for k in [int(x) for x in args.ks.split(",")]:
            for mode in modes:
                out = os.path.join(work, f"out-{k}-{mode}-{rep}")
                started = time.perf_counter()
                done = subprocess.run([sys.executable, "-c", CHILD, str(k), mode, paths["left"], paths["right"], out,
                                       str(args.window_ms)], capture_output=True, text=True, timeout=3600)
                wall = time.perf_counter() - started
                if done.returncode != 0:
                    print(done.stderr[-3000:], file=sys.stderr)
                    return 1
                r = json.loads(done.stdout.strip().splitlines()[-1])
                per_m = 1e6 / args.events
                r.update(k=k, mode=mode, whole_s=round(wall, 2), exact=(r["rows"], r["ts_sum"]) == (want["rows"], want["ts_sum"]),
                         run_events_per_s=round(args.events / r["run_s"]),
                         cpu_s_per_m_events={n: round(c * per_m, 2) for n, c in sorted(r["cpu_s"].items()) if c is not None})
                runs.append(r)
                print(f"k={k} {mode:6}: run {r['run_s']:.2f} s ({r['run_events_per_s']:,} events/s), whole {wall:.2f} s "
                      f"(import {r['import_s']:.2f}, deploy {r['deploy_s']:.2f}, write {r['write_s']:.2f}, shutdown "
                      f"{r['shutdown_s']:.2f}), exact {r['exact']}; CPU s per M events {r['cpu_s_per_m_events']}",
                      file=sys.stderr)
    figures = {}
    for k in sorted({r["k"] for r in runs}):
        for mode in modes:
            mine = [r for r in runs if r["k"] == k and r["mode"] == mode]
            figures[f"k={k} {mode}: run-only, median"] = f"{round(float(np.median([r['run_events_per_s'] for r in mine]))):,} events/s"
            figures[f"k={k} {mode}: whole process, median"] = f"{float(np.median([r['whole_s'] for r in mine])):.1f} s"
    rec = record(round(load, 2), events=args.events, window_ms=args.window_ms, expected=want, figures=figures,
                 runs=runs, all_exact=all(r["exact"] for r in runs))
    write(args.out, rec)
    print("\n".join(f"{n}: {v}" for n, v in figures.items()))
    return 0 if rec["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

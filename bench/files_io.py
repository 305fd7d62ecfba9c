"""The user's path with files in and files out (issue #29): a benchmark, not a test.

    python bench/files_io.py                    # k = 1 and 2, sink and driver, a table
    python bench/files_io.py --events 2000000 --json --out docs/experiments/files_io.json

The workload is a keyed 1 s tumbling count over 10,000 keys at 20,000 events per event-time
second (about 0.43 output rows per input), written beforehand as Parquet files (1M events per
file, not timed). Each setting runs in a fresh Python process, as a user's script does:
``import replistream``, ``deploy(q, servers=3, k=K, ...)``, ``dep.run({"events":
FileSource(dir)})``, ``shutdown``, and reports

* ``run``: ``dep.run()`` alone (feed, wait, collect): input events / second of it;
* ``whole``: from the process's start to its exit (import, Ray, deploy, run, shutdown).

Results either go to a ``ParquetSink`` written by the application replica (``sink``: no result
passes through the driver) or are fetched by the driver (``driver``: ``run()``'s outputs). The
output is checked against a numpy count of the same files (row count and totals).
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

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import replistream as rs
from replistream import FileSource, ParquetSink, Query, deploy, seconds
k, mode, src, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
q = Query("count")
s = FileSource(src, time="ts").declare(q, "events", punctuate_every=seconds(1))
s.window(size=seconds(1), by="key", aggs={"n": "count"}, name="per_key").sink("counts")
q = q.build()
sinks = {"counts": ParquetSink(out, every=seconds(10))} if mode == "sink" else None
t_import = time.perf_counter()
dep = deploy(q, servers=3, k=k, sinks=sinks, progress=False)
t_deploy = time.perf_counter()
res = dep.run({"events": FileSource(src, time="ts")}, timeout=1800)
t_run = time.perf_counter()
rows = int(sinks["counts"].manifest()["rows"]) if sinks else len(res.outputs["counts"])
total = int(sinks["counts"].read()["n"].sum()) if sinks else int(res.outputs["counts"]["n"].sum())
dep.shutdown()
t_end = time.perf_counter()
print(json.dumps({"import_s": t_import - t0, "deploy_s": t_deploy - t_import, "run_s": t_run - t_deploy,
                  "end_s": t_end - t0, "rows": rows, "total": total, "complete": res.complete}))
"""


def write_inputs(folder: str, events: int, per_file: int = 1_000_000, seed: int = 7) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    ts = np.arange(events, dtype=np.int64) * 50  # 20,000 events per event-time second
    key = rng.integers(0, 10_000, events)
    for i, a in enumerate(range(0, events, per_file)):
        pq.write_table(pa.table({"ts": ts[a:a + per_file], "key": key[a:a + per_file]}),
                       os.path.join(folder, f"part-{i:04d}.parquet"))
    window = ts // 1_000_000
    pairs = np.unique(window * 10_000 + key)
    return {"rows": int(len(pairs)), "total": int(events)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--ks", default="1,2")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="write the record (date, machine, load, command, figures) here")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="replistream-files-io-")
    src = os.path.join(work, "in")
    os.makedirs(src)
    want = write_inputs(src, args.events)
    load = os.getloadavg()[0]
    rows = []
    for k in [int(x) for x in args.ks.split(",")]:
        for mode in ("sink", "driver"):
            out = os.path.join(work, f"out-{k}-{mode}")
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", CHILD, str(k), mode, src, out], capture_output=True,
                                  text=True, timeout=3600)
            wall = time.perf_counter() - started
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(done.stdout.strip().splitlines()[-1])
            r.update(k=k, mode=mode, whole_s=round(wall, 2), exact=(r["rows"], r["total"]) == (want["rows"], want["total"]),
                     run_events_per_s=round(args.events / r["run_s"]), whole_events_per_s=round(args.events / wall))
            rows.append(r)
            print(f"k={k} {mode:6}: run {r['run_s']:.2f} s ({r['run_events_per_s']:,} events/s), whole "
                  f"{wall:.2f} s ({r['whole_events_per_s']:,} events/s), exact {r['exact']}", file=sys.stderr)
    figures = {f"k={r['k']} {r['mode']}: run-only": f"{r['run_events_per_s']:,} events/s" for r in rows}
    figures.update({f"k={r['k']} {r['mode']}: whole process": f"{r['whole_s']:.1f} s" for r in rows})
    rec = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()})",
           "load": round(load, 2), "command": f"python bench/files_io.py --events {args.events} --ks {args.ks}",
           "events": args.events, "figures": figures, "runs": rows, "all_exact": all(r["exact"] for r in rows)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)
    print(json.dumps(rec) if args.json else "\n".join(f"{n}: {v}" for n, v in figures.items()))
    return 0 if rec["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

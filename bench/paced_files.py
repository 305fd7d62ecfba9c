"""Paced W2 read from files, as a user replays it (issue #42): a benchmark, not a test.

    python bench/paced_files.py                       # k = 1 and 3, 30 s of event time each
    python bench/paced_files.py --k 1 3 --repeat 3 --out docs/experiments/paced_files.json

W2: a keyed one-second tumbling count of 10,000 keys at 20,000 events per event-time second,
written beforehand as Parquet files of 200,000 rows (not timed). Each run is a fresh Python
process: ``deploy(q, servers=3, k=K)``, ``dep.run({"events": FileSource(dir)}, pace=1.0)`` (the
files replayed in real time), ``shutdown``. Reported per run: the latency of each count from its
window's end (``window_end``, mapped to the replay's wall clock) to its arrival at the driver,
p50 / p99 / max over the windows after the first ``--skip`` s, and whether the counts equal a
numpy count of the same files.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchrecord import record, write  # noqa: E402

CHILD = r"""
import json, sys
import numpy as np
from replistream import FileSource, Query, deploy, seconds
k, src, skip = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
q = Query("w2")
s = FileSource(src, time="ts").declare(q, "events", punctuate_every=seconds(1))
s.window(size=seconds(1), by="key", aggs={"n": "count"}, name="per_key").sink("counts")
q = q.build()
dep = deploy(q, servers=3, k=k, progress=False)
res = dep.run({"events": FileSource(src, time="ts")}, pace=1.0, timeout=600)
dep.shutdown()
out, arr = res.outputs["counts"], res.arrivals["counts"]
lat = (arr - (out["window_end"] - res.ts0) / 1e6 / res.pace) * 1000.0
keep = out["window_end"] > res.ts0 + seconds(skip)
print(json.dumps({"p50_ms": float(np.percentile(lat[keep], 50)), "p99_ms": float(np.percentile(lat[keep], 99)),
                  "max_ms": float(lat[keep].max()), "rows": int(len(out)), "total": int(out["n"].sum()),
                  "complete": res.complete}))
"""


def write_inputs(folder: str, seconds_: int, rate: int = 20_000, keys: int = 10_000, seed: int = 5) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    n = rate * seconds_
    ts = np.arange(n, dtype=np.int64) * (1_000_000 // rate)
    key = rng.integers(0, keys, n)
    for i, a in enumerate(range(0, n, 200_000)):
        pq.write_table(pa.table({"ts": ts[a:a + 200_000], "key": key[a:a + 200_000]}),
                       os.path.join(folder, f"part-{i:03d}.parquet"))
    return {"rows": int(len(np.unique(ts // 1_000_000 * keys + key))), "total": int(n)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--seconds", type=int, default=30, help="event time replayed per run (default 30 s)")
    ap.add_argument("--skip", type=float, default=5.0, help="windows left out at the start (default 5 s)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the record (date, machine, load, command, figures) here")
    args = ap.parse_args()
    src = tempfile.mkdtemp(prefix="replistream-paced-files-")
    want = write_inputs(src, args.seconds)
    load = os.getloadavg()[0]
    runs = []
    for rep in range(args.repeat):
        for k in args.k:
            done = subprocess.run([sys.executable, "-c", CHILD, str(k), src, str(args.skip)], capture_output=True,
                                  text=True, timeout=1800)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            r = json.loads(done.stdout.strip().splitlines()[-1])
            r.update(k=k, exact=(r["rows"], r["total"]) == (want["rows"], want["total"]))
            runs.append(r)
            print(f"k={k}: latency from the window's end p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                  f"max {r['max_ms']:.1f} ms; exact {r['exact']}", file=sys.stderr)
    figures = {}
    for k in args.k:
        mine = [r for r in runs if r["k"] == k]
        for f in ("p50_ms", "p99_ms"):
            figures[f"k={k}: {f[:3]}, median of runs"] = f"{float(np.median([r[f] for r in mine])):.1f} ms"
    rec = record(round(load, 2), seconds=args.seconds, figures=figures, runs=runs, all_exact=all(r["exact"] for r in runs))
    write(args.out, rec)
    print("\n".join(f"{n}: {v}" for n, v in figures.items()))
    return 0 if rec["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

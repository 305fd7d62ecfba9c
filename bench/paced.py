"""Steady latency of a paced replay against the span of its pieces (issue #42): a benchmark, not a test.

    python bench/paced.py                                   # k = 1, 2, 3 at chunk_ms 5 and 20
    python bench/paced.py --k 2 --chunk-ms 5 20 --repeat 2 --out docs/experiments/paced.json

The query of ``bench/rescale.py`` (a keyed tumbling count, ``--window`` s, ``--keys`` keys,
``punctuate_every`` 100 ms) is fed paced at ``--rate`` events per second for ``--seconds`` s, with
no fault and no move, in a fresh deployment per run. Per run: the end-to-end latency of every
output tuple (arrival minus its timestamp's wall time: for a window's count, from the window's end
to the result in the application), its maximum per 4 s window of arrival time, and its median and
99th percentile after the first ``--skip`` s. Runs alternate over the spans (``--chunk-ms``), so a
drift of the machine falls on every span.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchrecord import record, write  # noqa: E402
from rescale import _inputs, _query  # noqa: E402  (the same query and input as the rescale benchmark)


def one(k: int, chunk_ms: float, args, data) -> dict:
    """One paced run in a fresh deployment: latency per 4 s window and its percentiles."""
    from replistream import deploy
    from replistream.engines.ray.pool import clear_pool

    clear_pool()
    with deploy(_query(args.window), servers=3, k=k, progress=False) as dep:
        started = time.time()
        dep.feed(data, pace=1.0, chunk_ms=chunk_ms)
        dep.wait(timeout=args.seconds * 10 + 120)
        arrival, latency = dep.latencies_ms("out")
        wall = time.time() - started
        span_max = dep.feeder.cut.max_seen_ms
    steady = arrival >= args.skip
    windows = [float(latency[(arrival >= a) & (arrival < a + 4)].max())
               for a in range(0, int(args.seconds), 4) if ((arrival >= a) & (arrival < a + 4)).any()]
    return {"k": k, "chunk_ms": chunk_ms, "wall_s": round(wall, 1), "outputs": int(len(latency)),
            "max_per_4s_ms": [round(w) for w in windows],
            "p50_ms": round(float(np.percentile(latency[steady], 50)), 1),
            "p99_ms": round(float(np.percentile(latency[steady], 99)), 1),
            "max_ms": round(float(latency[steady].max()), 1), "span_max_seen_ms": span_max}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 3], help="replication factors (default 1 2 3)")
    ap.add_argument("--chunk-ms", type=float, nargs="+", default=[5.0, 20.0], help="spans to compare (ms)")
    ap.add_argument("--rate", type=float, default=10_000.0, help="events per second of wall time")
    ap.add_argument("--seconds", type=float, default=40.0, help="event time fed per run (s)")
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--window", type=float, default=5.0, help="tumbling window (s)")
    ap.add_argument("--skip", type=float, default=8.0, help="seconds of arrival time left out of the percentiles")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", help="write the record (JSON) here")
    args = ap.parse_args()
    for name in ("rate", "seconds", "keys", "window", "repeat"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be > 0, got {getattr(args, name)}")
    if any(c <= 0 for c in args.chunk_ms) or any(k < 1 for k in args.k):
        ap.error("--chunk-ms must be > 0 and --k >= 1")
    load_before = os.getloadavg()[0]
    data = _inputs(int(args.rate * args.seconds), args.rate, args.keys)
    runs = []
    for rep in range(args.repeat):
        for k in args.k:
            for chunk_ms in args.chunk_ms:
                print(f"run {rep + 1}/{args.repeat}: k={k} chunk_ms={chunk_ms:g} ...", file=sys.stderr, flush=True)
                r = one(k, chunk_ms, args, data)
                print(json.dumps(r), flush=True)
                runs.append(r)
    figures = {f"run {i + 1}, k={r['k']}, chunk_ms {r['chunk_ms']:g}": f"largest latency {round(r['max_ms'])} ms, "
               f"p50 {round(r['p50_ms'])} ms, p99 {round(r['p99_ms'])} ms" for i, r in enumerate(runs)}
    write(args.out, record(f"load average {load_before:.1f} before", load_before=load_before,
                           params={k: v for k, v in vars(args).items() if k != "out"}, runs=runs, figures=figures))


if __name__ == "__main__":
    main()

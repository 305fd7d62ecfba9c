"""Size and time of hand-over checkpoints (docs/design.md, decision 7; a benchmark, not a test).

    python bench/handover.py                 # 300k tuples of state per case
    python bench/handover.py --tuples 50000  # smaller, a few seconds
    python bench/handover.py --json          # one JSON object on stdout

Each case builds one replica (:class:`~replistream.replica.ReplicaCore` with two
input stream replicas per port, as in a k=2 deployment) and feeds it seeded
batches of 10,000 tuples until it holds ``--tuples`` input tuples of state,
then delivers a punctuation ``p`` that leaves the last ``--above`` fraction of
the tuples above ``p`` (so the duplicate filters hold that many applied ids).
Then it times, best of ``--reps``:

* ``checkpoint``: ``core.checkpoint(bits)`` on the live replica;
* ``to_bytes``: pickling it (protocol 5), whose length is the size shipped;
* ``from_bytes``: unpickling;
* ``install``: ``ReplicaCore.from_checkpoint`` (building the new replica and
  restoring every piece).

``bits`` is 0 (one bin) and 12 (4096 bins, Megaphone's choice) for the binned
layout's cost. Cases:

* ``join``: equi-join on an int key (1000 keys), ``--tuples``/2 per input,
  window longer than the stream (nothing purged): the buffers hold every tuple.
* ``time_window_sliding``: 10,000 groups, windows of 4 slides (a tuple is in 4
  windows), count + exact float sum + mean + min: state is the open windows.
* ``time_window_summary``: tumbling windows, 10,000 groups, a user
  :class:`~replistream.Summary` (median): the windows keep every value.
* ``count_window``: windows of 1000 tuples, 100 groups, count + exact float
  sum; with the watermark below the tuples, they wait in the operator's own
  sort buffer.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import datetime as _dt
import gc
import json
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replistream import Punctuation, Query, Summary  # noqa: E402
from replistream.replica import ReplicaCheckpoint, ReplicaCore  # noqa: E402

BATCH = 10_000
STEP = 10  # microseconds between tuples


def _batches(schema, n: int, seed: int, cols) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    ts = np.arange(n, dtype=np.int64) * STEP + rng.integers(0, STEP, n)
    ids = (np.arange(n, dtype=np.uint64) + np.uint64(seed << 40))
    data = {"ts": ts, **cols(rng, n)}
    full = schema.from_columns(data, ids=ids)
    return [full[i:i + BATCH] for i in range(0, n, BATCH)]


def build_case(name: str, n: int, above: float):
    """(query, node, [(port, batches)], p): the replica to fill and the punctuation to deliver."""
    q = Query(name)
    p = int((1.0 - above) * n * STEP)
    if name == "join":
        left = q.source("left", {"k": "i8", "a": "f8"})
        right = q.source("right", {"k": "i8", "b": "f8"})
        left.join(right, window=10 * n * STEP, on="k", name="op").sink("out")
        q.build()

        def cols(rng, m):
            return {"k": rng.integers(0, 1000, m), "a": rng.normal(size=m)}

        def cols_r(rng, m):
            return {"k": rng.integers(0, 1000, m), "b": rng.normal(size=m)}

        feeds = [(0, _batches(q.schema_of("left"), n // 2, 1, cols)),
                 (1, _batches(q.schema_of("right"), n // 2, 2, cols_r))]
        return q, "op", feeds, int((1.0 - above) * (n // 2) * STEP)
    s = q.source("s", {"g": "i8", "v": "f8"})
    if name == "time_window_sliding":
        slide = n * STEP // 8
        s.window(size=4 * slide, slide=slide, by="g", name="op",
                 aggs={"n": "count", "sv": ("v", "sum"), "mv": ("v", "mean"), "lo": ("v", "min")}).sink("out")
        groups = 10_000
    elif name == "time_window_summary":
        s.window(size=2 * n * STEP, by="g", name="op",
                 aggs={"med": ("v", Summary(lambda v: float(np.median(v)), "f8"))}).sink("out")
        groups = 10_000
    elif name == "count_window":
        s.count_window(size=1000, by="g", name="op", aggs={"n": "count", "sv": ("v", "sum")}).sink("out")
        groups = 100
        p = -1  # the tuples wait in the count window's sort buffer
    else:
        raise ValueError(name)
    q.build()

    def cols_s(rng, m):
        return {"g": rng.integers(0, groups, m), "v": rng.normal(size=m) * 1e3}

    return q, "op", [(0, _batches(q.schema_of("s"), n, 3, cols_s))], p


def fill(q, node, feeds, p) -> ReplicaCore:
    core = ReplicaCore(q, node, channels=[2] * len(feeds), retain=True)
    for port, batches in feeds:
        for b in batches:
            core.process(port, 0, b)
            core.process(port, 1, b)  # the second stream replica's copy: dropped as a duplicate
    if p >= 0:
        for port, _ in feeds:
            core.process(port, 0, Punctuation(p))
    core.trim_output(np.iinfo(np.int64).max)  # downstream has every output: nothing to replay
    return core


def best(fn, reps: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(reps):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def measure(name: str, n: int, above: float, reps: int, bits_list) -> list[dict]:
    q, node, feeds, p = build_case(name, n, above)
    core = fill(q, node, feeds, p)
    rows = []
    for bits in bits_list:
        t_ck, ck = best(lambda: core.checkpoint(bits), reps)
        t_dump, blob = best(lambda: ck.to_bytes(), reps)
        t_load, ck2 = best(lambda: ReplicaCheckpoint.from_bytes(blob), reps)
        t_install, new = best(lambda: ReplicaCore.from_checkpoint(q, ck2, [2] * len(feeds)), reps)
        summ = ck.summary()
        rows.append({
            "case": name, "bits": bits, "input_tuples": n,
            "state_rows": summ["state_rows"], "applied_ids": summ["applied"],
            "bytes": len(blob), "bytes_per_input_tuple": len(blob) / n,
            "checkpoint_ms": 1e3 * t_ck, "to_bytes_ms": 1e3 * t_dump, "from_bytes_ms": 1e3 * t_load,
            "install_ms": 1e3 * t_install,
            "total_ms": 1e3 * (t_ck + t_dump + t_load + t_install),
        })
        _check(core, new, name)
    return rows


def _check(old: ReplicaCore, new: ReplicaCore, name: str) -> None:
    """The installed replica holds the same state: same checkpoint contents."""
    a, b = old.checkpoint(), new.checkpoint()
    assert a.punctuation == b.punctuation and a.logic.rows() == b.logic.rows(), name
    assert sorted(a.filters[0].applied_ids.tolist()) == sorted(b.filters[0].applied_ids.tolist()), name


def machine() -> dict:
    """bench/core.py's machine description, plus the load average (checkpoint times are noisy under load)."""
    from core import machine as base  # bench/core.py, next to this script

    return {**base(), "load_avg": os.getloadavg()}


def code_version() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "replistream"], cwd=here,
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except OSError:
        return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tuples", type=int, default=300_000, help="input tuples of state per case")
    ap.add_argument("--above", type=float, default=0.1, help="fraction of tuples above the punctuation p")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cases = [c for c in ("join", "time_window_sliding", "time_window_summary", "count_window") if args.only in c]
    rows = []
    for c in cases:
        rows.extend(measure(c, args.tuples, args.above, args.reps, (0, 12)))
    meta = {"date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
            "replistream": code_version(), "args": vars(args)}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
        return 0
    print(f"# {meta['date_utc']}  {meta['machine']['cpu']}  nproc={meta['machine']['nproc']}  "
          f"load={meta['machine']['load_avg']}  code {meta['replistream']}")
    print("| case | bits | state rows | applied ids | MB | B / input tuple | checkpoint ms | to_bytes ms "
          "| from_bytes ms | install ms | total ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['bits']} | {r['state_rows']:,} | {r['applied_ids']:,} | {r['bytes'] / 1e6:.2f} "
              f"| {r['bytes_per_input_tuple']:.1f} | {r['checkpoint_ms']:.1f} | {r['to_bytes_ms']:.1f} "
              f"| {r['from_bytes_ms']:.1f} | {r['install_ms']:.1f} | {r['total_ms']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

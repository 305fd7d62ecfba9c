"""W1 against a peer engine (issue #42): the two-source band join, replistream and Bytewax 0.21.1,
each in a fresh process, files in and files out. A benchmark, not a test.

    python3 -m venv /tmp/bw && /tmp/bw/bin/pip install bytewax==0.21.1    # once: Bytewax's own venv
    python bench/peers_w1.py --bytewax-python /tmp/bw/bin/python          # 360,000 events, k = 1
    python bench/peers_w1.py --bytewax-python /tmp/bw/bin/python --ks 1,3 --repeat 3 --out docs/experiments/peers_w1.json
    python bench/peers_w1.py --bytewax-python /tmp/bw/bin/python --events 20000 --json   # a quick check

Bytewax is never installed into this project's venv: ``--bytewax-python`` names the interpreter of a
venv of its own (made as above); when it is missing, or holds no Bytewax 0.21.1, the bench says so
in one line and stops (``--engines replistream`` runs without it).

The workload is bench/band_join.py's (its helpers are imported, not copied): two CSV files,
``left`` and ``right``, of ``--events / 2`` rows each (``ts``, ``key``, ``v``; 1,000 keys, 5,000
events per event-time second per side, uniform times, each file in time order), written before
any engine runs (not timed). The join: a left row ``l`` and a right row ``r`` make a pair when
``l.key == r.key`` and ``|l.ts - r.ts| < --window-ms``; the pair's time is ``max(l.ts, r.ts)``
and it holds both keys and both values (about ten pairs per left row at the defaults).

- **replistream**: bench/band_join.py's child script in ``sink`` mode, as a user runs it:
  ``deploy(q, servers=3, k=K)``, ``dep.run({"left": FileSource, "right": FileSource})``, results
  written by the application replica to a ``ParquetSink`` folder, ``shutdown()``. It starts a Ray
  of its own, unless ``--ray-address`` names a running cluster (``replistream up``) for it to join
  (its ``RAY_ADDRESS``): issue #42's whole-run target is for that case.
- **Bytewax**: a dataflow run with ``bytewax.run.cli_main(flow, workers_per_process=1)`` (what
  ``python -m bytewax.run`` calls), two ``CSVSource`` inputs, merged by event time, the band join,
  and a ``FileSink`` (one CSV line per pair). Bytewax's windowing cannot express this join exactly
  (``join_window`` pairs rows that share a tumbling or sliding window; a band of ``|l.ts - r.ts| <
  w`` is not a set of fixed windows, so pairs across a window edge are lost or repeated), so the
  join is a stateful operator, as a user would write it: ``stateful_flat_map`` keyed by the join
  key, holding each side's rows of that key in time order, probing the other side's rows within
  the band and dropping a row once the other side has passed it by the band. Bytewax has no
  event-time merge of two streams (``op.merge`` interleaves them as they arrive), so the merge is
  a ``stateful_batch`` step on one key that releases rows in time order once both inputs have
  reached them (and the rest at the end); ``--bytewax-merge arrival`` uses ``op.merge`` alone,
  which the join also handles exactly (it needs each side in time order per key, not the two
  sides interleaved by time).

Exactness: every output is read back and compared with a numpy band join of the same files: the
row count and a checksum of the rows as a multiset (each row's ``(ts, key_l, key_r, v_l, v_r)``,
floats by their bits, hashed with splitmix64, summed modulo 2**64). A run that is not exact (or
fails) is reported as such and gives no timing figure. Neither child reads its output back (the
check runs here, after the child ended; before 2026-11-29's second record the replistream child
read its ParquetSink back, 0.6-0.9 s of its whole process that Bytewax's did not spend); the
replistream child's one extra call is ``dep.metrics()``, for the CPU figures.

Reported per engine and setting: ``whole_s`` (the child process from start to exit, measured by
this script), ``run_s`` and ``run_events_per_s`` (input events over the time of the one call that
reads the inputs and writes every result: replistream's ``dep.run()``, Bytewax's ``cli_main()``;
each starts before the first input row is read and returns once the last result is in its output
files, so "first input to last result" is measured the same way for both, from outside the
engine, with ``time.perf_counter`` in the child), and CPU seconds: ``tree_cpu_s`` (user + system
of the child process and of the descendants it waited for, by ``getrusage(RUSAGE_CHILDREN)`` in
this script, the same for both; for replistream it holds Ray's daemons that the child started
and reaped, and a Ray worker process only if its parent reaped it, so it is not a per-replica
figure: at 20,000 events it was 4.8 s against 2.6 s of engine_cpu_s), ``engine_cpu_s`` (replistream: the CPU seconds of every
replica process as its metrics report them, plus the driver's; Bytewax: its one process), and
per million input events. Bytewax runs one worker in one process; replistream at k=1 runs three
replica processes (entry, join, application) on this machine's cores.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from band_join import CHILD as REPLISTREAM_CHILD  # noqa: E402
from band_join import write_inputs  # noqa: E402
from benchrecord import record, write  # noqa: E402

BYTEWAX_VERSION = "0.21.1"

BYTEWAX_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from collections import deque
import bytewax.operators as op
from bytewax.connectors.files import CSVSource, FileSink
from bytewax.dataflow import Dataflow
from bytewax.operators import StatefulBatchLogic
from bytewax.run import cli_main
left, right, out, window_ms, merge = sys.argv[1:6]
W = int(window_ms) * 1000


class TimeMerge(StatefulBatchLogic):
    # rows of both inputs in time order: a row leaves once the other input has reached its time
    def __init__(self, resume_state):
        self.q = (deque(), deque())

    def on_batch(self, rows):
        q = self.q
        for row in rows:
            q[row[0]].append(row)
        a, b = q
        out = []
        while a and b:
            out.append(a.popleft() if a[0][1] <= b[0][1] else b.popleft())
        return out, StatefulBatchLogic.RETAIN

    def on_eof(self):
        rest = sorted(list(self.q[0]) + list(self.q[1]), key=lambda row: row[1])
        self.q = (deque(), deque())
        return rest, StatefulBatchLogic.RETAIN

    def snapshot(self):
        return None


def band(state, row):
    # state: each side's (ts, v) of this key, in time order; a row of the other side at or below
    # ts - W can match no later row of this side (each side comes in time order)
    side, t, key, v = row
    if state is None:
        state = (deque(), deque())
    other = state[1 - side]
    while other and other[0][0] <= t - W:
        other.popleft()
    pairs = []
    for u, w in other:
        if u >= t + W:
            break
        if side == 0:
            pairs.append(f"{t if t > u else u},{key},{v},{key},{w}")
        else:
            pairs.append(f"{t if t > u else u},{key},{w},{key},{v}")
    state[side].append((t, v))
    return state, pairs


flow = Dataflow("w1_band_join")
sides = [op.map(f"parse_{name}", op.input(name, flow, CSVSource(path)),
                lambda r, s=s: (s, int(r["ts"]), r["key"], r["v"]))
         for s, (name, path) in enumerate((("left", left), ("right", right)))]
merged = op.merge("merge", *sides)
if merge == "event-time":
    merged = op.key_rm("unkey", op.stateful_batch("by_time", op.key_on("one", merged, lambda r: "all"), TimeMerge))
pairs = op.stateful_flat_map("band", op.key_on("key", merged, lambda r: r[2]), band)
op.output("out", pairs, FileSink(out))
t_import = time.perf_counter()
cli_main(flow, workers_per_process=1)
t_run = time.perf_counter()
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"import_s": t_import - t0, "run_s": t_run - t_import, "driver_cpu_s": ru.ru_utime + ru.ru_stime}))
"""


def at_rest(address: str) -> None:
    """Before a run joined to a cluster: wait until its warm pool is full again (the run before took
    from it and the pool refills once the machine is quiet), so each run meets a cluster at rest,
    as a user's script does (bench/startup.py does the same)."""
    from replistream.engines.ray import cluster

    if address == "auto":
        mine = cluster.recorded()
        if mine is None:
            return  # not a cluster of `replistream up`: nothing to wait for
        address = mine["address"]
    cluster.start_warm_pool(address, wait=True)


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def checksum(ts, key_l, key_r, v_l, v_r) -> dict:
    """``{"rows", "checksum"}`` of output rows as a multiset: each row's fields (floats by their bits)
    hashed together with splitmix64, the hashes summed modulo 2**64, so row order does not count.

    >>> a = checksum([5, 7], [1, 2], [1, 2], [0.5, 0.25], [0.1, 0.2])
    >>> a == checksum([7, 5], [2, 1], [2, 1], [0.25, 0.5], [0.2, 0.1]), a == checksum([5, 7], [1, 2], [1, 2], [0.5, 0.25], [0.1, 0.3])
    (True, False)
    """
    cols = [np.asarray(c, np.int64).view(np.uint64) for c in (ts, key_l, key_r)]
    cols += [np.asarray(c, np.float64).view(np.uint64) for c in (v_l, v_r)]
    h = np.zeros(len(cols[0]), np.uint64)
    with np.errstate(over="ignore"):
        for c in cols:
            h = _splitmix(h ^ c)
        return {"rows": len(h), "checksum": int(h.sum(dtype=np.uint64))}


def _read_side(path: str) -> dict:
    import pyarrow.csv as pacsv

    t = pacsv.read_csv(os.path.join(path, "part-0000.csv"))
    return {n: t[n].to_numpy() for n in ("ts", "key", "v")}


def expected(paths: dict, window_us: int) -> dict:
    """The band join of the two files by numpy, every pair built: ``{"rows", "checksum"}``.

    Right rows sorted by ``(key, ts)`` sit at ``key * span + ts`` (sorted); the band of a left row
    is one interval of that array, found by two binary searches, then expanded."""
    L, R = _read_side(paths["left"]), _read_side(paths["right"])
    w = int(window_us)
    order = np.lexsort((R["ts"], R["key"]))
    rk, rt, rv = R["key"][order], R["ts"][order], R["v"][order]
    tmin = int(min(L["ts"].min(), rt.min())) - w
    span = int(max(L["ts"].max(), rt.max())) + w + 1 - tmin
    kmin = int(min(L["key"].min(), rk.min()))
    if (int(max(L["key"].max(), rk.max())) - kmin + 1) * span >= 2 ** 62:
        raise ValueError("expected(): keys times time span overflow int64 positions")
    pos = (rk - kmin) * span + (rt - tmin)
    base = (L["key"] - kmin) * span - tmin
    lo = np.searchsorted(pos, base + L["ts"] - (w - 1), "left")
    hi = np.searchsorted(pos, base + L["ts"] + (w - 1), "right")
    cnt = hi - lo
    li = np.repeat(np.arange(len(cnt)), cnt)
    ri = np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))
    return checksum(np.maximum(L["ts"][li], rt[ri]), L["key"][li], rk[ri], L["v"][li], rv[ri])


def read_replistream(out: str) -> dict:
    from replistream import ParquetSink

    got = ParquetSink(out).read()
    return checksum(got["ts"], got["key_l"], got["key_r"], got["v_l"], got["v_r"])


def read_bytewax(out: str) -> dict:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    names = ["ts", "key_l", "v_l", "key_r", "v_r"]
    if not os.path.getsize(out):
        return checksum([], [], [], [], [])
    t = pacsv.read_csv(out, read_options=pacsv.ReadOptions(column_names=names),
                       convert_options=pacsv.ConvertOptions(column_types={
                           "ts": pa.int64(), "key_l": pa.int64(), "key_r": pa.int64(),
                           "v_l": pa.float64(), "v_r": pa.float64()}))
    return checksum(*(t[n].to_numpy() for n in ("ts", "key_l", "key_r", "v_l", "v_r")))


def bytewax_missing(python: str | None) -> str | None:
    """Why ``python`` cannot run Bytewax 0.21.1 (one line naming the fix), or None when it can."""
    fix = (f"make a venv of its own: python3 -m venv /tmp/bw && /tmp/bw/bin/pip install bytewax=={BYTEWAX_VERSION}, "
           f"then pass --bytewax-python /tmp/bw/bin/python (or --engines replistream to run without it)")
    if not python:
        return f"Bytewax is missing: no --bytewax-python given; {fix}"
    if not os.access(python, os.X_OK):
        return f"Bytewax is missing: --bytewax-python {python} is not an executable interpreter; {fix}"
    got = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('bytewax'))"],
                         capture_output=True, text=True, timeout=120)
    version = got.stdout.strip()
    if got.returncode != 0:
        return f"Bytewax is missing: {python} has no bytewax package; {fix}"
    if version != BYTEWAX_VERSION:
        return f"Bytewax {version} at {python}, not {BYTEWAX_VERSION}; {fix}"
    return None


def run_child(cmd: list, env: dict | None) -> tuple:
    """``(completed process, wall seconds, CPU seconds of the child and the descendants it waited for)``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=360_000, help="input events, half per side")
    ap.add_argument("--window-ms", type=int, default=1000, help="the band: |left.ts - right.ts| < this")
    ap.add_argument("--engines", default="replistream,bytewax", help="replistream and/or bytewax")
    ap.add_argument("--ks", default="1", help="replistream's k values, e.g. 1,3")
    ap.add_argument("--bytewax-python", default=None, help="the interpreter of a venv holding bytewax==0.21.1")
    ap.add_argument("--bytewax-merge", default="event-time", choices=["event-time", "arrival"])
    ap.add_argument("--ray-address", default=None, help="a running cluster for replistream to join (RAY_ADDRESS)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the record as JSON on stdout")
    ap.add_argument("--out", default=None, help="write the record (date, machine, load, command, figures) here")
    args = ap.parse_args()
    engines = args.engines.split(",")
    if not engines or not set(engines) <= {"replistream", "bytewax"}:
        ap.error(f"--engines takes replistream and/or bytewax, got {args.engines!r}")
    if args.events < 2 or args.window_ms <= 0 or args.repeat < 1:
        ap.error("--events must be at least 2, --window-ms and --repeat positive")
    ks = [int(x) for x in args.ks.split(",")]
    if "bytewax" in engines:
        why = bytewax_missing(args.bytewax_python)
        if why:
            print(why, file=sys.stderr)
            return 2
    work = tempfile.mkdtemp(prefix="replistream-peers-w1-")
    paths = write_inputs(work, args.events)
    want = expected(paths, args.window_ms * 1000)
    print(f"{args.events:,} events, {want['rows']:,} output pairs expected ({work})", file=sys.stderr)
    load = os.getloadavg()[0]
    per_m = 1e6 / args.events
    settings = ([("replistream", k) for k in ks] if "replistream" in engines else []) + \
               ([("bytewax", 1)] if "bytewax" in engines else [])
    runs = []
    for rep in range(args.repeat):
        for engine, k in settings:
            out = os.path.join(work, f"out-{engine}-{k}-{rep}")
            if args.ray_address:  # every engine, Bytewax too: no refill of the pool runs beside it
                at_rest(args.ray_address)
            if engine == "replistream":
                env = dict(os.environ)
                if args.ray_address:
                    env["RAY_ADDRESS"] = args.ray_address
                else:
                    env.pop("RAY_ADDRESS", None)
                cmd = [sys.executable, "-c", REPLISTREAM_CHILD, str(k), "sink", paths["left"], paths["right"],
                       out, str(args.window_ms), "nocheck"]
            else:
                env = None
                open(out, "w").close()  # Bytewax's FileSink appends to a file that must exist
                cmd = [args.bytewax_python, "-c", BYTEWAX_CHILD, os.path.join(paths["left"], "part-0000.csv"),
                       os.path.join(paths["right"], "part-0000.csv"), out, str(args.window_ms), args.bytewax_merge]
            done, wall, tree_cpu = run_child(cmd, env)
            r = {"engine": engine, "k": k, "repeat": rep, "whole_s": round(wall, 3), "tree_cpu_s": round(tree_cpu, 2)}
            if done.returncode != 0:
                r.update(exact=False, error=done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"])
                print(f"{engine} k={k}: FAILED (exit {done.returncode}), no timing: {r['error'][0]}", file=sys.stderr)
                print(done.stderr[-3000:], file=sys.stderr)
                runs.append(r)
                continue
            child = json.loads(done.stdout.strip().splitlines()[-1])
            try:
                got = read_replistream(out) if engine == "replistream" else read_bytewax(out)
            except Exception as e:  # noqa: BLE001 -- an unreadable output is a wrong one, reported as such
                got = {"rows": None, "checksum": None, "error": f"{type(e).__name__}: {e}"}
            r.update(got=got, exact=(got.get("rows"), got.get("checksum")) == (want["rows"], want["checksum"]),
                     run_s=round(child["run_s"], 3), import_s=round(child["import_s"], 3))
            if engine == "replistream":
                actors = {n: c for n, c in sorted(child["cpu_s"].items()) if c is not None}
                r.update(deploy_s=round(child["deploy_s"], 3), shutdown_s=round(child["shutdown_s"], 3),
                         engine_cpu_s=round(sum(actors.values()) + child["driver_cpu_s"], 2),
                         cpu_s_per_m_events={**{n: round(c * per_m, 2) for n, c in actors.items()},
                                             "driver": round(child["driver_cpu_s"] * per_m, 2)})
            else:
                r.update(engine_cpu_s=round(child["driver_cpu_s"], 2),
                         cpu_s_per_m_events={"process": round(child["driver_cpu_s"] * per_m, 2)},
                         merge=args.bytewax_merge)
            if not r["exact"]:
                print(f"{engine} k={k}: NOT EXACT, no timing: got {got}, expected {want}", file=sys.stderr)
                runs.append(r)
                continue
            r["run_events_per_s"] = round(args.events / child["run_s"])
            runs.append(r)
            print(f"{engine} k={k}: run {r['run_s']:.2f} s ({r['run_events_per_s']:,} events/s), whole "
                  f"{wall:.2f} s, CPU {r['engine_cpu_s']:.2f} s (tree {tree_cpu:.2f} s), exact; CPU s per M events "
                  f"{r['cpu_s_per_m_events']}", file=sys.stderr)
    figures = {}
    med = {}
    for engine, k in settings:
        name = f"{engine} k={k}" if engine == "replistream" else f"bytewax ({args.bytewax_merge} merge)"
        mine = [r for r in runs if (r["engine"], r["k"]) == (engine, k)]
        good = [r for r in mine if r["exact"]]
        if len(good) < len(mine):
            figures[f"{name}: not exact or failed"] = f"{len(mine) - len(good)} of {len(mine)} runs"
        if not good:
            continue
        rate = float(np.median([r["run_events_per_s"] for r in good]))
        whole = float(np.median([r["whole_s"] for r in good]))
        med[(engine, k)] = (rate, whole)
        figures[f"{name}: run, median"] = f"{round(rate):,} events/s"
        figures[f"{name}: whole process, median"] = f"{whole:.1f} s"
        figures[f"{name}: CPU, median"] = f"{float(np.median([r['engine_cpu_s'] for r in good])):.1f} s"
    if ("bytewax", 1) in med:
        bw_rate, bw_whole = med[("bytewax", 1)]
        for k in ks:
            if ("replistream", k) in med:
                rate, whole = med[("replistream", k)]
                figures[f"k={k} against Bytewax: run rate"] = f"{rate / bw_rate:.2f}x (target at k=1: >= 2x)"
                figures[f"k={k} against Bytewax: whole process"] = (
                    f"{whole / bw_whole:.2f}x Bytewax's time (target at k=1, with a cluster running: <= 1x)")
    all_exact = bool(runs) and all(r["exact"] for r in runs)
    rec = record(round(load, 2), events=args.events, window_ms=args.window_ms, bytewax=BYTEWAX_VERSION,
                 bytewax_merge=args.bytewax_merge, ray_address=args.ray_address, expected=want, figures=figures,
                 runs=runs, all_exact=all_exact)
    write(args.out, rec)
    if args.json:
        print(json.dumps(rec, indent=1))
    else:
        print("\n".join(f"{n}: {v}" for n, v in figures.items()))
    return 0 if all_exact else 1


if __name__ == "__main__":
    raise SystemExit(main())

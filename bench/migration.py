"""Live state migration, as in Megaphone §5.3 (issue #8 item 5; a benchmark, not a test).

    python bench/migration.py                       # the full run (1M keys, ~10 minutes)
    python bench/migration.py --keys 100000 --quick # a small check
    python bench/migration.py --json out.json       # also write every figure as JSON
    python bench/migration.py --skip-overhead --skip-dormant --operators join aggregate \
        --strategies all-at-once fluid --bits 12    # a Join and an Aggregate moved, 2^12 bins
    python bench/migration.py --skip-overhead --skip-dormant --operators keyed join --curve \
        --json docs/experiments/megaphone_bins.json --plot docs/experiments/megaphone_bins.png
                                                    # Megaphone Fig. 13: latency against 2^0..2^16 bins
    python bench/migration.py --markdown RUN1.json RUN2.json RUN3.json --plot curve.png
                                                    # the same curve run three times: each point's median

Two parts.

**Binning overhead** (in process, no Ray). A keyed count
(:class:`~replistream.operators.keyed.KeyedCountLogic`, ``by="k"``, keeping an
88-byte ``tag`` per key, so 112 bytes of state per key: >= 100 MB at 1M keys)
is loaded with ``--keys`` distinct keys, then fed ``--batches`` batches of
10,000 tuples with uniformly random keys, each followed by a punctuation (so
every batch is applied and emitted). Tuples per second of CPU time (the
process's own, so other load on the machine matters less) for state kept with
``bits`` = 0 (one bin: no per-bin versions) and 4, 8, 12, 16; runs of the
different ``bits`` are interleaved, in alternating order, best of ``--reps``. Also the cost of a
per-bin snapshot of 1, 16, 256 and all 4096 bins of the loaded state (what a
step of a transfer costs the sender).

**Dormant replicas (Del Monte 2017)** (in process). The same keyed count
with 2^12 and 2^16 bins; a dormant copy (:class:`~replistream.replica.DormantReplica`)
restored from a full checkpoint; then 1,000, 10,000 or 100,000 tuples of
random keys; then revival, either from a full checkpoint (take, pickle,
unpickle, install) or from the dormant copy and one delta of the bins changed
since (take, pickle, unpickle, ``revive``): bytes and time, best of ``--reps``.

**A transfer step of a Join** (in process, with the dormant part). A windowed
equi-Join lays out its buffers in bins only when a checkpoint is taken: the cost of
one step (one bin of 2^6 or 2^10) against laying out the whole state and then
selecting the bin, 200,000 tuples per side.

**Migration under load** (Ray, one replica per operator, so the moving
replica is the only one serving: its pauses are the application's). The
query ``s -> KeyedCount(bits=12, keep=("tag",), emit_keep=False) -> sink``
(the tag stays in the state, not in the output, which halves the data the
application receives) is loaded with ``--keys`` keys (``--operators join aggregate``
move a windowed Join or a 1-s window count instead; see :func:`build`)
(20 s of event time), then fed ``--rate`` tuples/s of random keys, paced in real
time, punctuations every 20 ms of event time. ``--move-at`` seconds into the
steady phase, ``Deployment.move_replica`` moves the counting replica to another
server with each strategy (all-at-once; batched with 16 steps; fluid, one bin
per step) at several transfer bin counts. Reported per run: the transfer's
duration (first step asked to merged receiver), the largest time the sender
spent taking and sending one step, the maximum and 99th percentile
application latency (output arrival minus its timestamp's due time) over the
outputs that arrived during the transfer and in the 2 s after it
(``transfer_*``), during the whole move including the start of the new
actor (``move_*``), and before the move (``before_*``, steady state), and the
exact match with the reference.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import datetime as _dt
import gc
import json
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.core import code_version, machine  # noqa: E402
from replistream import Punctuation, Query, Schema, seconds  # noqa: E402
from replistream.operators.keyed import KeyedCount, KeyedCountLogic  # noqa: E402
from replistream.testing import Call  # noqa: E402

SCHEMA = Schema({"k": "i8", "tag": "S88"})
BATCH = 10_000


def _tags(keys: np.ndarray) -> np.ndarray:
    return np.char.add(b"tag-", keys.astype("S20")).astype("S88")


def _batch(keys: np.ndarray, ts: np.ndarray, id0: int) -> np.ndarray:
    b = SCHEMA.empty(len(keys))
    b["ts"], b["id"], b["k"], b["tag"] = ts, np.arange(id0, id0 + len(keys), dtype=np.uint64), keys, _tags(keys)
    return b


# -- part 1: binning overhead --------------------------------------------------------------
def overhead(keys: int, batches: int, reps: int, bits_list=(0, 4, 8, 12, 16)) -> dict:
    rng = np.random.default_rng(1)
    load = _batch(np.arange(keys, dtype=np.int64), np.zeros(keys, dtype=np.int64), 0)
    feed = [_batch(rng.integers(0, keys, BATCH), np.full(BATCH, i + 1, dtype=np.int64), keys + i * BATCH)
            for i in range(batches)]
    best: dict[int, float] = {}
    snap: dict = {}
    state_mb = None
    for rep in range(reps):
        for bits in (bits_list if rep % 2 == 0 else bits_list[::-1]):  # alternate the order: drift cancels
            op = KeyedCountLogic("c", [SCHEMA], by="k", keep=("tag",), bits=bits)
            op.process(0, load)
            op.process(0, Punctuation(0))
            gc.collect()
            t = time.process_time()  # CPU time of this (single-threaded) process: robust to other load
            for i, b in enumerate(feed):
                op.process(0, b)
                op.process(0, Punctuation(i + 1))
            dt = time.process_time() - t
            best[bits] = min(best.get(bits, float("inf")), dt)
            if bits == 12 and rep == 0:
                state_mb = op.state.nbytes / 1e6
                for n in (1, 16, 256, 4096):
                    chosen = np.sort(rng.choice(4096, n, replace=False))
                    ts = []
                    for _ in range(5):
                        t1 = time.perf_counter()
                        op.checkpoint(12, chosen)
                        ts.append(time.perf_counter() - t1)
                    snap[n] = min(ts) * 1e3
            del op
            gc.collect()
    tput = {bits: batches * BATCH / dt for bits, dt in best.items()}
    base = tput[0]
    return {"keys": keys, "state_mb": state_mb, "batches": batches, "reps": reps,
            "tuples_per_s": tput, "overhead_pct": {b: 100.0 * (base / v - 1.0) for b, v in tput.items()},
            "snapshot_ms_at_12_bits": snap}


# -- part 3: dormant replicas with incremental checkpoints (Del Monte) -------------------------
def dormant(keys: int, bits_list=(12, 16), updates=(1_000, 10_000, 100_000), reps: int = 3) -> list[dict]:
    """Revival of a keyed-count replica (``keys`` keys) from a full checkpoint, against reviving a
    dormant copy last refreshed ``updates`` tuples (uniformly random keys) ago from one last delta:
    bytes shipped, and time to take, pickle, unpickle and install (``revive``), best of ``reps``."""
    from replistream.replica import DormantReplica, ReplicaCheckpoint, ReplicaCore

    rng = np.random.default_rng(3)
    out = []
    for bits in bits_list:
        q = Query("dormant")
        q.source("s", SCHEMA).apply(KeyedCount(by="k", keep=("tag",), bits=bits), name="c").sink("out")
        q = q.build()
        live = ReplicaCore(q, "c", channels=[1], retain=False)
        live.process(0, 0, _batch(np.arange(keys, dtype=np.int64), np.zeros(keys, dtype=np.int64), 0))
        live.process(0, 0, Punctuation(0))
        t, nid = 1, keys
        for n in updates:
            base, base_v = live.checkpoint(bits), live.logic.version()
            for i in range(0, n, BATCH):
                m = min(BATCH, n - i)
                live.process(0, 0, _batch(rng.integers(0, keys, m), np.full(m, t, dtype=np.int64), nid))
                live.process(0, 0, Punctuation(t))
                t, nid = t + 1, nid + m
            full_s, delta_s = [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                data = live.checkpoint(bits).to_bytes()
                ReplicaCore.from_checkpoint(q, ReplicaCheckpoint.from_bytes(data), [1], retain=False)
                full_s.append(time.perf_counter() - t0)
                copy = DormantReplica(q, base, base_v)  # the dormant copy as of its last refresh
                t0 = time.perf_counter()
                dck, changed, v = live.delta_checkpoint(base_v)
                ddata = dck.to_bytes()
                copy.revive(ReplicaCheckpoint.from_bytes(ddata), changed, v, channels=[1], retain=False)
                delta_s.append(time.perf_counter() - t0)
            out.append({"bits": bits, "keys": keys, "updates_since_refresh": n, "changed_bins": int(len(changed)),
                        "bins": 1 << bits, "full_mb": len(data) / 1e6, "full_ms": 1e3 * min(full_s),
                        "delta_mb": len(ddata) / 1e6, "delta_ms": 1e3 * min(delta_s)})
            del base, copy
            gc.collect()
    return out


# -- part 2: migration under load -------------------------------------------------------------
def inputs(keys: int, rate: int, steady_s: float, load_s: float = 20.0, chunk_ms: int = 20, seed: int = 2):
    """Load phase (every key once over ``load_s`` s), then ``rate`` tuples/s of random keys."""
    rng = np.random.default_rng(seed)
    chunks = []
    per = int(keys / (load_s * 1000 / chunk_ms))
    order = rng.permutation(keys)
    t = 0
    for i in range(0, keys, per):
        k = order[i:i + per]
        chunks.append({"ts": np.full(len(k), t, dtype=np.int64) + np.arange(len(k)) % (chunk_ms * 1000),
                       "k": k, "tag": _tags(k)})
        t += chunk_ms * 1000
    n = int(rate * chunk_ms / 1000)
    steady_start = t
    for _ in range(int(steady_s * 1000 / chunk_ms)):
        k = rng.integers(0, keys, n)
        chunks.append({"ts": t + np.sort(rng.integers(0, chunk_ms * 1000, n)), "k": k, "tag": _tags(k)})
        t += chunk_ms * 1000
    return chunks, steady_start


OPERATORS = ("keyed", "join", "aggregate")
JOIN_WINDOW_S = 30.0
AGG_WINDOW_S = 1.0


def build(operator: str, keys: int, rate: int, steady_s: float):
    """The query and its inputs for ``operator`` (the moving operator is named ``op``):

    * ``keyed``: ``s -> KeyedCount(by="k", keep=("tag",), bits=12)``: one state row per key,
      every key loaded in the first 20 s;
    * ``join``: ``l ⋈ r`` on ``k`` within 30 s: the load phase (every key once, with its
      88-byte tag) arrives on ``l`` and stays in the Join's window; in the steady phase ``l`` and
      ``r`` each carry ``rate / 2`` tuples/s of random keys, so about one output per ``r``
      tuple; the state is the window's tuples;
    * ``aggregate``: ``s -> window(1 s, by="k", count)``: the state is the open 1-s windows'
      groups (about 50,000 during the load phase, ``rate`` per second after).
    """
    chunks, steady_start = inputs(keys, rate, steady_s)
    q = Query("migration")
    if operator == "keyed":
        s = q.source("s", SCHEMA, punctuate_every=seconds(0.02))
        s.apply(KeyedCount(by="k", keep=("tag",), bits=12, emit_keep=False), name="op").sink("out")
        data = {"s": chunks}
    elif operator == "join":
        left = q.source("l", SCHEMA, punctuate_every=seconds(0.02))
        right = q.source("r", {"k": "i8"}, punctuate_every=seconds(0.02))
        left.join(right, window=seconds(JOIN_WINDOW_S), on="k", name="op").sink("out")
        rng = np.random.default_rng(5)
        lefts, rights = [], []
        for c in chunks:
            if c["ts"][0] < steady_start:  # the load phase: left only
                lefts.append(c)
                continue
            side = rng.random(len(c["k"])) < 0.5
            lefts.append({f: v[side] for f, v in c.items()})
            rights.append({"ts": c["ts"][~side], "k": c["k"][~side]})
        data = {"l": lefts, "r": rights}
    elif operator == "aggregate":
        s = q.source("s", SCHEMA, punctuate_every=seconds(0.02))
        s.window(size=seconds(AGG_WINDOW_S), by="k", aggs={"n": "count"}, name="op").sink("out")
        data = {"s": chunks}
    else:
        raise ValueError(f"operator must be one of {OPERATORS}, got {operator!r}")
    return q.build(), data, steady_start


def migrate(keys: int, rate: int, strategy: str, bits: int, move_at: float, tail_s: float, steady_s: float,
            check: bool, operator: str = "keyed", pause_ms: float = 5.0, spares: int = 1) -> dict:
    from replistream.engines.ray import deploy
    from replistream.testing import assert_same_output, run_reference

    q, data, steady_start = build(operator, keys, rate, steady_s)
    move_ts = steady_start + seconds(move_at)
    box: dict = {}

    def start_move(dep):
        def run():
            try:
                target = [srv for srv in dep.servers if srv != dep.actor_server["op#0"]][0]
                box["t"] = time.time() - dep.t0
                box["event"] = dep.move_replica("op", 0, target, strategy=strategy, bits=bits,
                                                  pause_ms=pause_ms)
                box["t_end"] = time.time() - dep.t0
            except Exception as e:  # reported, not hidden
                box["error"] = repr(e)

        th = threading.Thread(target=run, daemon=True)
        box["thread"] = th
        th.start()

    first = next(iter(data))
    chunks = data[first]
    at = next(i for i, c in enumerate(chunks) if c["ts"][0] >= move_ts)
    data[first] = chunks[:at] + [Call(start_move)] + chunks[at:]
    out: dict = {"operator": operator, "strategy": strategy, "bits": bits, "keys": keys, "rate": rate,
                 "pause_ms": pause_ms, "spares": spares}
    # spares: the receiving replica takes a warm actor instead of starting a process, as Megaphone
    # moves state between workers that already run (a process start takes about a core-second here,
    # which on two cores the serving replica would pay in latency before the first step)
    with deploy(q, servers=3, k=1, flush_ms=2.0, spares=spares) as dep:
        res = dep.run(data, pace=1.0, timeout=steady_s + 60)
        if "thread" in box:
            box["thread"].join(timeout=600)
        arrival, lat = dep.latencies_ms("out")
        out["complete"] = bool(res.complete)
        if not res.complete:  # say why: links dropped by a blocked sender, per actor
            import ray

            stats = {l: ray.get(h.stats.remote(), timeout=30) for l, h in dep.handles.items() if dep.alive.get(l)}
            out["dropped"] = [d for st in stats.values() for d in st.get("dropped", [])]
            out["installed"] = {l: st.get("installed") for l, st in stats.items() if "installed" in st}
        if "error" in box:
            out["error"] = box["error"]
            return out
        tr = dep.transfers()[-1]
        h = next(iter(box["event"]["handover"].values()))
        t_start, t_end = box["t"], box["t_end"]
        x0 = tr["started_s"]  # the transfer proper: first step asked .. receiver merged
        x1 = x0 + tr["seconds"]
        steady0 = t_start - 4.0  # the last 4 s before the move (the load phase has drained by then)

        def stats(mask, name):
            out[f"{name}_max_ms"] = float(lat[mask].max()) if mask.any() else None
            out[f"{name}_p99_ms"] = float(np.percentile(lat[mask], 99)) if mask.any() else None

        stats((arrival >= steady0) & (arrival < t_start), "before")
        stats((arrival >= x0) & (arrival <= x1 + 2.0), "transfer")
        stats((arrival >= t_start) & (arrival <= t_end + 2.0), "move")
        # max latency per 250 ms of arrival time, from 2 s before the move to 3 s after the transfer
        edges = np.arange(t_start - 2.0, x1 + 3.0, 0.25)
        idx = np.searchsorted(edges, arrival) - 1
        ok = (idx >= 0) & (idx < len(edges) - 1)
        peaks = np.full(len(edges) - 1, np.nan)
        np.fmax.at(peaks, idx[ok], lat[ok])
        p99s = [float(np.percentile(lat[ok][idx[ok] == i], 99)) if (idx[ok] == i).any() else np.nan
                for i in range(len(edges) - 1)]
        out["timeline"] = {"start_s": round(float(edges[0]), 3), "step_s": 0.25,
                           "max_ms": [None if np.isnan(v) else round(float(v), 1) for v in peaks],
                           "p99_ms": [None if np.isnan(v) else round(float(v), 1) for v in p99s],
                           "transfer_s": [round(x0, 3), round(x1, 3)],
                           "step_done_s": [round(x0 + t, 3) for t in tr.get("step_s", [])][:64]}
        out.update({
            "steps": tr["steps"], "transfer_s": tr["seconds"], "restarts": tr["restarts"],
            "sender_max_step_ms": None if h.get("max_checkpoint_s") is None else 1e3 * h["max_checkpoint_s"],
            "bytes_moved": h.get("bytes"), "sends": h.get("sends"), "move_started_s": t_start, "transfer_started_s": x0,
            "move_ended_s": t_end, "outputs": int(len(lat)),
        })
        if check:
            ref = run_reference(q, data)
            try:
                assert_same_output(ref.outputs["out"], res.outputs["out"])
                out["exact"] = True
            except AssertionError as e:
                out["exact"] = False
                out["diff"] = str(e)[:300]
    return out


# -- part 4: a transfer step of a Join (state binned at checkpoint time) ----------------------
def join_steps(rows: int = 200_000, bits_list=(6, 10), reps: int = 5) -> list[dict]:
    """What one step of a batched or fluid transfer of a windowed equi-Join costs the sender.
    A Join lays out its two buffers in bins only when a checkpoint is taken, so every step
    hashes its whole state; ``checkpoint(bits, bins)`` then sorts and copies only the rows of
    ``bins``. Compared with laying out the whole state and selecting (what a step cost before):
    ``rows`` tuples per side with 64-byte padding, keys that never match, best of ``reps``."""
    from replistream import Schema
    from replistream.operators.join import JoinLogic

    ls = Schema({"key": "i8", "x": "i8", "pad": "S64"})
    rs = Schema({"key": "i8", "y": "f8", "pad": "S64"})
    rng = np.random.default_rng(5)
    j = JoinLogic("j", [ls, rs], window=10**12, left_key="key", right_key="key")
    j.process(0, ls.from_columns({"ts": np.arange(rows), "key": rng.integers(0, 10**6, rows),
                                  "x": np.zeros(rows, np.int64), "pad": np.full(rows, b"l" * 64)}, ids=np.arange(rows)))
    j.process(1, rs.from_columns({"ts": np.arange(rows), "key": rng.integers(10**6, 2 * 10**6, rows),
                                  "y": np.zeros(rows), "pad": np.full(rows, b"r" * 64)},
                                 ids=np.arange(rows, 2 * rows)))

    def best(f):
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return 1e3 * min(ts)

    out = []
    for bits in bits_list:
        whole = j.checkpoint(0)
        mb = sum(a.nbytes for t in whole.tables.values() for a in t.values()) / 1e6
        out.append({"rows_per_side": rows, "bits": bits, "state_mb": mb,
                    "one_bin_ms": best(lambda: j.checkpoint(bits, [1])),
                    "whole_then_select_ms": best(lambda: j.checkpoint(bits).select([1])),
                    "whole_ms": best(lambda: j.checkpoint(bits))})
    return out


# -- part 5: Megaphone's curve: latency during a move against the number of bins -------------------
CURVE_BITS = (0, 2, 4, 6, 8, 10, 12, 14, 16)


def _curve_points(runs: list, op: str, strategy: str, key: str) -> list[tuple[int, float]]:
    """``(bins, median of key)`` per bin count of ``op`` moved with ``strategy``: exact runs only."""
    by: dict[int, list[float]] = {}
    for r in runs:
        if r["operator"] == op and r["strategy"] == strategy and r.get(key) is not None and r.get("exact", True):
            by.setdefault(1 << r["bits"], []).append(float(r[key]))
    return sorted((b, float(np.median(v))) for b, v in by.items())


def plot_curve(report: dict, png: str, before: dict | None = None) -> None:
    """Megaphone Fig. 13's layout for this engine: per moving operator (rows), the maximum and
    99th-percentile latency of the outputs arriving during the transfer and the 2 s after it, and
    the transfer's duration (columns), against the number of bins (log scale), one line per
    strategy (the median where a bin count was run more than once), and dashed the median over the
    runs of the same latency in the 4 s before each move (the floor the live path sets with no
    move). ``before``: an earlier report, drawn faint and dotted in the same colours beside it
    (its date in the legend). Failed or inexact runs are left out of the lines and listed in the
    title.

    >>> plot_curve(json.load(open("new.json")), "curve.png", before=json.load(open("old.json")))  # doctest: +SKIP
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in report.get("migration", []) if "steps" in r]
    old_runs = [r for r in (before or {}).get("migration", []) if "steps" in r]
    old_date = str((before or {}).get("date", "before"))[:10]
    ops = sorted({r["operator"] for r in runs}, key=OPERATORS.index)
    fig, axes = plt.subplots(len(ops), 3, figsize=(13, 3.6 * len(ops)), squeeze=False)
    cols = (("transfer_max_ms", "max latency (ms)"), ("transfer_p99_ms", "p99 latency (ms)"),
            ("transfer_s", "transfer duration (s)"))
    for row, op in zip(axes, ops):
        for ax, (key, label) in zip(row, cols):
            for color, strategy in zip(("C0", "C1", "C2"), ("all-at-once", "batched", "fluid")):
                pts = _curve_points(runs, op, strategy, key)
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=color, label=strategy)
                old = _curve_points(old_runs, op, strategy, key)
                if old:
                    ax.plot(*zip(*old), marker=".", color=color, linestyle=":", alpha=0.45,
                            label=f"{strategy} ({old_date})")
            before = [r[key.replace("transfer_", "before_")] for r in runs if r["operator"] == op
                      and r.get(key.replace("transfer_", "before_")) is not None]
            if before and key != "transfer_s":  # the floor: the same latency with no move, 4 s before it
                ax.axhline(float(np.median(before)), color="grey", linestyle="--", label="no move (median)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("bins")
            ax.set_ylabel(label)
            ax.set_title(f"{op}: {label}")
            ax.grid(True, which="both", alpha=0.3)
        row[0].legend()
    bad = [f"{r.get('operator')}/{r.get('strategy')}/2^{r.get('bits')}" for r in report.get("migration", [])
           if "steps" not in r or r.get("exact") is False]
    fig.suptitle("Latency during a live move against the number of bins (Megaphone Fig. 13's axes)"
                 + (f"; failed or inexact: {', '.join(bad)}" if bad else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def merge_reports(reports: list[dict]) -> dict:
    """One report from repeated runs of the same benchmark: the first one's fields, every run's
    moves (``migration``, each tagged with the index of its report as ``run``), and the date span.

    >>> merge_reports([{"date": "a", "migration": [{"x": 1}]}, {"date": "b", "migration": [{"x": 2}]}])["migration"]
    [{'x': 1, 'run': 0}, {'x': 2, 'run': 1}]
    """
    if len(reports) == 1:
        return reports[0]
    merged = dict(reports[0])
    merged["migration"] = [{**r, "run": i} for i, rep in enumerate(reports) for r in rep.get("migration", [])]
    merged["date"] = f"{reports[0].get('date')} .. {reports[-1].get('date')}"
    merged["runs"] = len(reports)
    return merged


def median_table(report: dict) -> str:
    """Per operator, the median over repeated runs of the maximum latency during the transfer and
    the 2 s after it, strategy against bins (exact runs only: :func:`_curve_points`, the plot's
    points), and the median of the same maximum in the 4 s before each move.

    >>> print(median_table({"migration": [
    ...     {"operator": "keyed", "strategy": "fluid", "bits": 0, "steps": 1, "transfer_max_ms": v,
    ...      "before_max_ms": 30.0} for v in (10.0, 30.0, 20.0)]}))
    **keyed**, median max latency during the transfer + 2 s (ms):
    | strategy | 1 bins |
    |---|---:|
    | fluid | 20.0 |
    no move (the 4 s before each move): median 30.0 ms, 30.0-30.0 ms
    <BLANKLINE>
    """
    runs = [r for r in report.get("migration", []) if "steps" in r]
    lines = []
    for op in sorted({r["operator"] for r in runs}, key=lambda o: OPERATORS.index(o) if o in OPERATORS else 99):
        mine = [r for r in runs if r["operator"] == op]
        bins = sorted({1 << r["bits"] for r in mine})
        lines += [f"**{op}**, median max latency during the transfer + 2 s (ms):",
                  "| strategy | " + " | ".join(f"{b:,} bins" for b in bins) + " |", "|---|" + "---:|" * len(bins)]
        for strategy in ("all-at-once", "batched", "fluid"):
            pts = dict(_curve_points(runs, op, strategy, "transfer_max_ms"))
            if pts:
                lines.append(f"| {strategy} | " + " | ".join("-" if b not in pts else f"{pts[b]:,.1f}" for b in bins)
                             + " |")
        floor = [float(r["before_max_ms"]) for r in mine if r.get("before_max_ms") is not None]
        if floor:
            lines.append(f"no move (the 4 s before each move): median {np.median(floor):,.1f} ms, "
                         f"{min(floor):,.1f}-{max(floor):,.1f} ms")
        lines.append("")
    return "\n".join(lines)


def _md_table(rows, header: tuple, cells) -> list[str]:
    """A right-aligned markdown table of ``rows`` (``cells(row)`` gives the formatted cells),
    followed by a blank line; nothing when there are no rows."""
    if not rows:
        return []
    out = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    out += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return out + [""]


def markdown(report: dict) -> str:
    """The figures as markdown tables (what docs/benchmarks.md and docs/migration.md show)."""
    lines = []
    ov = report.get("overhead")
    if ov:
        lines += ["| bits | bins | tuples/s (CPU time) | vs. bits = 0 |", "|---:|---:|---:|---:|"]
        for b, v in ov["tuples_per_s"].items():
            lines.append(f"| {b} | {1 << int(b):,} | {v / 1e6:.3f} M | {ov['overhead_pct'][b]:+.1f}% |")
        lines.append("")
        lines.append("snapshot of n of 4,096 bins (ms): " + ", ".join(
            f"{n}: {v:.2f}" for n, v in ov["snapshot_ms_at_12_bits"].items()))
        lines.append("")
    lines += _md_table(
        report.get("dormant"),
        ("bins", "tuples since refresh", "changed bins", "full checkpoint MB / ms", "last delta MB / ms"),
        lambda r: (f"{r['bins']:,}", f"{r['updates_since_refresh']:,}", f"{r['changed_bins']:,}",
                   f"{r['full_mb']:.1f} / {r['full_ms']:.0f}", f"{r['delta_mb']:.1f} / {r['delta_ms']:.0f}"))
    lines += _md_table(
        report.get("join_steps"),
        ("Join rows per side", "state MB", "bins", "one-bin step ms", "whole state laid out, then one bin ms",
         "whole checkpoint ms"),
        lambda r: (f"{r['rows_per_side']:,}", f"{r['state_mb']:.1f}", f"{1 << r['bits']:,}", f"{r['one_bin_ms']:.1f}",
                   f"{r['whole_then_select_ms']:.1f}", f"{r['whole_ms']:.1f}"))
    runs = report.get("migration")
    if runs:
        lines += ["| operator | strategy | transfer bins | pause ms | steps (sends) | transfer s | "
                  "sender's longest step ms | MB moved | "
                  "max / p99 latency before (ms) | max / p99 during transfer + 2 s (ms) | "
                  "max latency, whole move (ms) | exact |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

        def f(x, d=0):
            return "-" if x is None else f"{x:,.{d}f}"

        for r in runs:
            if "error" in r or "steps" not in r:
                lines.append(f"| {r.get('operator', 'keyed')} | {r['strategy']} | {1 << r['bits']:,} | "
                             f"error: {r.get('error')} |")
                continue
            lines.append(
                f"| {r.get('operator', 'keyed')} | {r['strategy']} | {1 << r['bits']:,} | {f(r.get('pause_ms'), 1)} | "
                f"{r['steps']:,} ({f(r.get('sends'))}) | {f(r['transfer_s'], 2)} | "
                f"{f(r['sender_max_step_ms'])} | {f(r['bytes_moved'] / 1e6, 1)} | "
                f"{f(r['before_max_ms'])} / {f(r['before_p99_ms'])} | {f(r['transfer_max_ms'])} / "
                f"{f(r['transfer_p99_ms'])} | {f(r['move_max_ms'])} | {r.get('exact', '-')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--move-at", type=float, default=10.0)
    ap.add_argument("--tail", type=float, default=6.0, help="steady seconds after the longest transfer")
    ap.add_argument("--bits", type=int, nargs="*", default=[6, 8, 10])
    ap.add_argument("--strategies", nargs="*", default=["all-at-once", "batched", "fluid"])
    ap.add_argument("--pause-ms", type=float, nargs="*", default=[20.0],
                    help="a sender's pause budget per punctuation beyond a step's fixed cost (0: one step "
                         "per punctuation); each value is a run of batched and fluid")
    ap.add_argument("--operators", nargs="*", default=["keyed"], choices=OPERATORS,
                    help="which operator moves: keyed count (default), join, aggregate (see build())")
    ap.add_argument("--spares", type=int, default=1,
                    help="warm spare actors of the deployment (deploy(spares=...)): the moved replica's "
                         "new actor is one of them (0: it starts a process during the move)")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-migration", action="store_true")
    ap.add_argument("--skip-dormant", action="store_true")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with the reference run")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None, nargs="+", metavar="JSON",
                    help="print the tables of earlier --json files and exit; several files (repeated runs of "
                         "the same curve) are merged: the plot and the medians table take each point's median")
    ap.add_argument("--curve", action="store_true",
                    help="Megaphone Fig. 13: every strategy at every --bits (default 0, 2, .., 16 with --curve), "
                         "plotted to --plot")
    ap.add_argument("--plot", default=None, metavar="PNG",
                    help="plot latency and duration against bins to PNG (with --curve, or from --markdown's file)")
    ap.add_argument("--before", default=None, metavar="JSON",
                    help="with --plot: an earlier run's JSON, drawn faint beside the new curve")
    a = ap.parse_args()
    if a.curve and a.bits == [6, 8, 10]:
        a.bits = list(CURVE_BITS)
    if a.plot and not a.curve and not a.markdown:
        ap.error("--plot needs --curve (a run) or --markdown FILE (an earlier run's JSON): add one")
    if a.before and not a.plot:
        ap.error("--before needs --plot PNG (the figure it is drawn in): add one")
    before = None
    if a.before:
        with open(a.before) as fh:
            before = json.load(fh)
    if a.markdown:
        reports = []
        for path in a.markdown:
            with open(path) as fh:
                reports.append(json.load(fh))
        merged = merge_reports(reports)
        if a.plot:
            plot_curve(merged, a.plot, before)
            print(f"wrote {a.plot}")
            return
        print(markdown(merged))
        if len(reports) > 1:
            print(median_table(merged))
        return
    report = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
              "code": code_version(), "args": vars(a), "loadavg_start": os.getloadavg()}
    if not a.skip_overhead:
        ov = overhead(a.keys, a.batches if not a.quick else 20, a.reps if not a.quick else 1)
        report["overhead"] = ov
        print(f"binning overhead, {ov['keys']:,} keys ({ov['state_mb']:.0f} MB of state), tuples/s:", flush=True)
        for b, v in ov["tuples_per_s"].items():
            print(f"  bits={b:2d}: {v / 1e6:.3f}M/s  overhead {ov['overhead_pct'][b]:+.1f}%", flush=True)
        print("  snapshot of n bins at 12 bits (ms):", {k: round(v, 2) for k, v in ov["snapshot_ms_at_12_bits"].items()},
              flush=True)
    if not a.skip_dormant:
        report["dormant"] = dm = dormant(a.keys, reps=a.reps if not a.quick else 1)
        print("dormant copy with incremental checkpoints vs full checkpoint:", flush=True)
        for r in dm:
            print(f"  bits={r['bits']:2d} updates={r['updates_since_refresh']:>7,}: changed bins "
                  f"{r['changed_bins']:,}/{r['bins']:,}; full {r['full_mb']:.1f} MB {r['full_ms']:.0f} ms; "
                  f"delta {r['delta_mb']:.1f} MB {r['delta_ms']:.0f} ms", flush=True)
    if not a.skip_dormant:  # the Join's step cost goes with the other in-process parts
        report["join_steps"] = js = join_steps(reps=a.reps if not a.quick else 1)
        print("one transfer step of a Join (bins laid out at checkpoint time):", flush=True)
        for r in js:
            print(f"  {r['rows_per_side']:,} rows per side ({r['state_mb']:.0f} MB), {1 << r['bits']:,} bins: one bin "
                  f"{r['one_bin_ms']:.1f} ms; whole layout then one bin {r['whole_then_select_ms']:.1f} ms; whole "
                  f"{r['whole_ms']:.1f} ms", flush=True)
    if not a.skip_migration:
        from replistream.engines.ray import init_ray

        init_ray(num_cpus=2, object_store_memory=1024 * 1024 * 1024)
        runs = []
        for operator in a.operators:
            for strategy in a.strategies:
                for bits in ([a.bits[-1]] if strategy == "all-at-once" and not a.curve else a.bits):
                    for pause in ([a.pause_ms[0]] if strategy == "all-at-once" else a.pause_ms):
                        # one bin per punctuation (20 ms) with no pause budget: leave it time to finish
                        slow = strategy == "fluid" and pause == 0
                        # a fluid move of many bins takes about 2.5 ms per step with a pause budget
                        steady = a.move_at + a.tail + (0.03 * (1 << bits) if slow else
                                                       max(10.0, 0.0025 * (1 << bits)) if strategy == "fluid"
                                                       else 10.0)
                        r = migrate(a.keys, a.rate, strategy, bits, a.move_at, a.tail, steady, not a.no_check,
                                    operator=operator, pause_ms=pause, spares=a.spares)
                        runs.append(r)
                        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                                          if k != "timeline"}), flush=True)
                        gc.collect()
        report["migration"] = runs
    report["loadavg_end"] = os.getloadavg()
    print(markdown(report), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    if a.plot and report.get("migration"):
        plot_curve(report, a.plot, before)
        print(f"wrote {a.plot}", flush=True)


if __name__ == "__main__":
    main()

"""Single-core throughput of the core operator logic (a benchmark, not a test).

    python bench/core.py                        # 1M tuples in 10k-tuple batches
    python bench/core.py --quick                # 100k tuples, a few seconds
    python bench/core.py --json                 # one JSON object on stdout
    python bench/core.py --only join            # cases whose name contains "join"
    python bench/core.py --profile duplicate    # cProfile one run instead of timing

Every workload is generated with a seeded numpy RNG and cut into batches
*before* timing; only the loop that feeds items to ``process`` is timed
(``time.perf_counter``), after a short warm-up on a fresh operator, and the
best of ``--reps`` repetitions (each on a fresh operator) is reported. Runs
are single-threaded (one core). After timing, each case's output is checked
against an independently computed expectation; a wrong output is reported as
CHECK FAILED and its target as not met, and the exit status is 1.

Workloads (``n`` tuples, ``batch`` tuples per batch, timestamps ~10 us apart):

* ``DuplicateFilter``: 3 channels each deliver every tuple (3n arrivals for n
  unique tuples). Channels are interleaved batch by batch, channel c lagging
  ``c * --df-lag`` batches; each channel sends ``Punctuation(max ts it
  delivered)`` every ``--punct-every`` of its batches. Headline = arrivals/s;
  unique tuples/s in the notes.
* ``Filter``: predicate ``x < 0.5`` on uniform x (passes ~50%).
* ``Union``: 2 inputs, batches alternate between them.
* ``Join``: equi-join on int ``k`` (1000 keys), n/2 tuples per input on
  independent timelines over the same span, batches alternate L, R; window
  chosen for ~3 partners per tuple; punctuations every
  ``--join-punct-every`` batches per input. Headline = input tuples/s.
* ``Aggregate``: time windows (tumbling, and sliding with size = 4 x slide)
  and count windows, grouped by int ``k`` (100 groups), aggs count, exact
  float sum, mean.

Non-DuplicateFilter inputs get ``Punctuation(max ts delivered)`` every
``--punct-every`` batches; every input ends with ``Punctuation(END)`` (all in
the timed loop), so windows close and join buffers are purged.

To measure a pinned version of replistream rather than a working tree that is
being edited, put an export of it first on the path, e.g.
``git archive HEAD replistream | tar -x -C /tmp/rs && PYTHONPATH=/tmp/rs python bench/core.py``;
``--json`` reports which copy was imported.
"""
from __future__ import annotations

import os

# One core: keep any threaded numpy backend single-threaded (set before numpy loads).
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import datetime as _dt
import gc
import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import replistream
from replistream.ids import mix, stable_hash
from replistream.operators.aggregate import CountWindowAggregateLogic, TimeWindowAggregateLogic
from replistream.operators.dupfilter import DuplicateFilter
from replistream.operators.join import JoinLogic
from replistream.operators.stateless import FilterLogic, UnionLogic
from replistream.schema import END, Punctuation, Schema

TARGETS = {  # stated by the project: tuples/s on one core
    "DuplicateFilter (3 channels)": 2_000_000,
    "Aggregate time tumbling": 1_000_000,
}

MEAN_GAP_US = 10  # mean timestamp gap between consecutive tuples of one stream
AGG_AGGS = {"n": "count", "s": ("x", "sum"), "m": ("x", "mean")}


# -- data ---------------------------------------------------------------------
def timeline(rng: np.random.Generator, m: int, mean_gap: int) -> np.ndarray:
    """Non-decreasing int64 timestamps with gaps uniform in [1, 2*mean_gap)."""
    return np.cumsum(rng.integers(1, 2 * mean_gap, size=m, dtype=np.int64))


def make_stream(schema: Schema, ts: np.ndarray, cols: dict, source: str) -> np.ndarray:
    ids = mix(stable_hash(source), np.arange(len(ts), dtype=np.uint64))
    return schema.from_columns({"ts": ts, **cols}, ids=ids)


def cut(stream: np.ndarray, batch: int) -> list[np.ndarray]:
    # Copies, so each batch owns its buffer as it would after deserialisation.
    return [stream[i:i + batch].copy() for i in range(0, len(stream), batch)]


def with_punctuations(port_batches: list[list[np.ndarray]], every: int) -> list[tuple[int, object]]:
    """Interleave ports batch by batch (round robin); each port sends
    Punctuation(max ts delivered so far) every ``every`` of its batches and END last."""
    items: list[tuple[int, object]] = []
    sent = [0] * len(port_batches)
    maxts = [None] * len(port_batches)
    longest = max(len(b) for b in port_batches)
    for i in range(longest):
        for port, batches in enumerate(port_batches):
            if i >= len(batches):
                continue
            b = batches[i]
            items.append((port, b))
            sent[port] += 1
            mt = int(b["ts"].max())
            maxts[port] = mt if maxts[port] is None else max(maxts[port], mt)
            if every and sent[port] % every == 0:
                items.append((port, Punctuation(maxts[port])))
    for port in range(len(port_batches)):
        items.append((port, Punctuation(END)))
    return items


def dupfilter_items(batches: list[np.ndarray], n_channels: int, every: int,
                    lag: int) -> tuple[list[tuple[int, object]], int]:
    """Channel c delivers every batch, ``c * lag`` batches behind channel 0.

    Also returns how many arrivals have ts > the filter's max punctuation when
    they arrive (those reach the per-id lookup; the rest are dropped by one
    vectorised comparison)."""
    items: list[tuple[int, object]] = []
    sent = [0] * n_channels
    maxts = [None] * n_channels
    max_p = None
    looked_up = 0
    nb = len(batches)
    for step in range(nb + (n_channels - 1) * lag):
        for c in range(n_channels):
            i = step - c * lag
            if not 0 <= i < nb:
                continue
            b = batches[i]
            items.append((c, b))
            looked_up += len(b) if max_p is None else int((b["ts"] > max_p).sum())
            sent[c] += 1
            mt = int(b["ts"].max())
            maxts[c] = mt if maxts[c] is None else max(maxts[c], mt)
            if every and sent[c] % every == 0:
                items.append((c, Punctuation(maxts[c])))
                max_p = maxts[c] if max_p is None else max(max_p, maxts[c])
    for c in range(n_channels):
        items.append((c, Punctuation(END)))
    return items, looked_up


# -- cases --------------------------------------------------------------------
@dataclass
class Case:
    name: str
    make: Callable[[], object]  # a fresh operator
    items: list  # (port, item), built before timing
    work: int  # tuples counted for the headline figure
    notes: Callable[[object, float], str]  # (operator after the best run, its seconds) -> notes
    extra: Callable[[object, float], dict] = field(default=lambda op, t: {})
    expect: Callable[[object, list], None] = field(default=lambda op, outs: None)  # raises AssertionError


def batches_of(outs: list) -> list[np.ndarray]:
    return [x for x in outs if not isinstance(x, Punctuation)]


def concat(outs: list, schema: Schema) -> np.ndarray:
    b = batches_of(outs)
    return np.concatenate(b) if b else schema.empty()


def expected_join_pairs(left: np.ndarray, right: np.ndarray, window: int) -> int:
    """Pairs with equal k and |ts_l - ts_r| < window, counted independently of JoinLogic."""
    span = int(max(left["ts"].max(), right["ts"].max())) + 2 * window + 1
    code = np.sort(right["k"] * span + right["ts"])
    lc = left["k"] * span + left["ts"]
    return int((np.searchsorted(code, lc + window, "left") - np.searchsorted(code, lc - window, "right")).sum())


def build_cases(n: int, batch: int, every: int, join_every: int, df_lag: int, seed: int) -> list[Case]:
    rng = np.random.default_rng(seed)
    kx = Schema({"k": "i8", "x": "f8"})
    cases: list[Case] = []

    # DuplicateFilter: one stream, 3 replicas of it.
    ts = timeline(rng, n, MEAN_GAP_US)
    base = make_stream(kx, ts, {"k": rng.integers(0, 1000, n), "x": rng.random(n)}, "src")
    batches = cut(base, batch)
    n_ch = 3
    df_items, looked_up = dupfilter_items(batches, n_ch, every, df_lag)

    def df_expect(op, outs):
        out = concat(outs, kx)
        assert len(out) == n, f"passed {len(out):,} tuples, expected {n:,}"
        assert len(np.unique(out["id"])) == n, "duplicate ids passed"

    cases.append(Case(
        "DuplicateFilter (3 channels)", lambda: DuplicateFilter(n_ch, kx, name="df"), df_items, n_ch * n,
        lambda op, t: (f"headline = arrivals/s ({n_ch} x {n:,}); unique: {n / t / 1e6:.2f}M tuples/s; "
                       f"channel lags 0/{df_lag}/{2 * df_lag} batches, punct every {every} batches/channel; "
                       f"{looked_up / (n_ch * n):.0%} of arrivals reach the per-id lookup"),
        lambda op, t: {"unique_per_s": n / t, "arrivals": n_ch * n, "unique": n,
                       "looked_up_fraction": looked_up / (n_ch * n)},
        df_expect,
    ))

    # Filter: x < 0.5 on uniform x.
    f_items = with_punctuations([batches], every)
    want_f = int((base["x"] < 0.5).sum())

    def f_expect(op, outs):
        assert len(concat(outs, kx)) == want_f, "wrong number of tuples passed"

    cases.append(Case(
        "Filter", lambda: FilterLogic("f", [kx], lambda b: b["x"] < 0.5), f_items, n,
        lambda op, t: f"predicate x < 0.5 on uniform x, passes {want_f / n:.1%}",
        expect=f_expect,
    ))

    # Union: 2 inputs, alternating batches, each input its own timeline.
    half = n // 2
    u_in = [cut(make_stream(kx, timeline(rng, m, 2 * MEAN_GAP_US),
                            {"k": rng.integers(0, 1000, m), "x": rng.random(m)}, f"u{p}"), batch)
            for p, m in enumerate((half, n - half))]
    u_items = with_punctuations(u_in, every)

    def u_expect(op, outs):
        out = concat(outs, kx)
        assert len(out) == n and len(np.unique(out["id"])) == n, "wrong output count or ids"

    cases.append(Case(
        "Union (2 inputs)", lambda: UnionLogic("u", [kx, kx]), u_items, n,
        lambda op, t: "batches alternate between the 2 inputs", expect=u_expect,
    ))

    # Join: equi-join on k (1000 keys). Per input, tuples are GAP us apart, so a
    # tuple's expected partners = P(same key) * (2*window / GAP) = 3  ->  window below.
    keys, gap, matches = 1000, 2 * MEAN_GAP_US, 3
    window = matches * gap * keys // 2
    L, R = Schema({"k": "i8", "x": "f8"}), Schema({"k": "i8", "y": "f8"})
    j_streams = [make_stream(s, timeline(rng, m, gap), {"k": rng.integers(0, keys, m), f: rng.random(m)}, f"j{p}")
                 for p, (s, f, m) in enumerate(((L, "x", half), (R, "y", n - half)))]
    j_items = with_punctuations([cut(s, batch) for s in j_streams], join_every)
    want_pairs = expected_join_pairs(j_streams[0], j_streams[1], window)

    def j_expect(op, outs):
        got = sum(len(b) for b in batches_of(outs))
        assert got == want_pairs, f"{got:,} pairs, expected {want_pairs:,}"

    cases.append(Case(
        "Join (equi, 1000 keys)",
        lambda: JoinLogic("j", [L, R], window=window, left_key="k", right_key="k"), j_items, n,
        lambda op, t: (f"headline = input tuples/s; {want_pairs:,} pairs out "
                       f"({want_pairs / t / 1e6:.2f}M pairs/s, {2 * want_pairs / n:.2f} partners/tuple); "
                       f"window {window / 1000:g} ms, punct every {join_every} batches/input"),
        lambda op, t: {"pairs_out": want_pairs, "pairs_per_s": want_pairs / t, "window_us": window},
        j_expect,
    ))

    # Aggregates: 100 groups, count + sum(x) + mean(x).
    groups = 100
    ts = timeline(rng, n, MEAN_GAP_US)
    agg_stream = make_stream(kx, ts, {"k": rng.integers(0, groups, n), "x": rng.normal(10.0, 3.0, n)}, "agg")
    a_items = with_punctuations([cut(agg_stream, batch)], every)
    size = 100_000  # 100 ms: ~10k tuples per window, ~100 per (group, window)
    csize = 100
    per_group = np.bincount(agg_stream["k"], minlength=groups)
    total_x = float(agg_stream["x"].sum())

    def agg_expect(windows_per_tuple: int, want_count: int):
        def expect(op, outs):
            out = np.concatenate(batches_of(outs))
            assert int(out["n"].sum()) == want_count, f"counts sum to {int(out['n'].sum()):,}, expected {want_count:,}"
            if windows_per_tuple:
                assert np.isclose(out["s"].sum(), windows_per_tuple * total_x), "sums disagree"
            assert np.allclose(out["m"], out["s"] / out["n"]), "mean != sum / count"
        return expect

    def agg_notes(desc):
        return lambda op, t: (f"{desc}, {groups} groups, count+sum+mean; {op.tuples_out:,} windows out; "
                              f"punct every {every} batches")

    cases.append(Case(
        "Aggregate time tumbling",
        lambda: TimeWindowAggregateLogic("tw", [kx], size=size, by="k", aggs=AGG_AGGS), a_items, n,
        agg_notes(f"size {size // 1000} ms"),
        lambda op, t: {"windows_out": op.tuples_out}, agg_expect(1, n),
    ))
    cases.append(Case(
        "Aggregate time sliding",
        lambda: TimeWindowAggregateLogic("sw", [kx], size=size, slide=size // 4, by="k", aggs=AGG_AGGS),
        a_items, n, agg_notes(f"size {size // 1000} ms, slide {size // 4000} ms (4 windows/tuple)"),
        lambda op, t: {"windows_out": op.tuples_out}, agg_expect(4, 4 * n),
    ))
    cases.append(Case(
        "Aggregate count tumbling",
        lambda: CountWindowAggregateLogic("cw", [kx], size=csize, by="k", aggs=AGG_AGGS), a_items, n,
        agg_notes(f"size {csize} tuples"),
        lambda op, t: {"windows_out": op.tuples_out}, agg_expect(0, int((per_group // csize * csize).sum())),
    ))
    return cases


# -- timing -------------------------------------------------------------------
def run(op, items) -> list:
    proc = op.process
    outs: list = []
    keep = outs.extend
    for port, item in items:
        keep(proc(port, item))
    return outs


def time_case(case: Case, reps: int, warmup_items: int) -> tuple[float, object, list]:
    run(case.make(), case.items[:warmup_items])  # warm-up on a fresh operator
    best, best_op, best_outs = float("inf"), None, None
    for _ in range(reps):
        op = outs = None
        gc.collect()
        op = case.make()
        t0 = time.perf_counter()
        outs = run(op, case.items)
        dt = time.perf_counter() - t0
        if dt < best:
            best, best_op, best_outs = dt, op, outs
    return best, best_op, best_outs


def check(case: Case, op, outs: list) -> str | None:
    """Outputs against independently computed expectations (outside timing); None if fine."""
    late = getattr(op, "late_count", 0)
    try:
        assert not late, f"{late} tuples dead-lettered as late"
        if isinstance(op, TimeWindowAggregateLogic):
            assert op.open_windows == 0, f"{op.open_windows} windows still open after END"
        case.expect(op, outs)
    except AssertionError as e:
        return str(e) or "assertion failed"
    return None

# -- machine ------------------------------------------------------------------
def machine() -> dict:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = round(int(line.split()[1]) / 1024 ** 2, 1)
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"nproc": usable, "cpu": cpu, "mem_gib": mem, "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform()}


def code_version() -> dict:
    """Which replistream was measured: its path, git HEAD, files differing from HEAD."""
    pkg = os.path.dirname(os.path.abspath(replistream.__file__))
    info: dict = {"path": pkg}

    def git(*a):
        return subprocess.run(["git", "--no-optional-locks", "-C", pkg, *a], capture_output=True, text=True,
                              timeout=10)

    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode == 0:
            info["git_head"] = head.stdout.strip()
            st = git("status", "--porcelain", "--", ".")
            info["modified"] = [ln[3:] for ln in st.stdout.splitlines()] if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return info


# -- output -------------------------------------------------------------------
def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def rate_cell(r: dict) -> str:
    return "error" if r.get("tuples_per_s") is None else fmt_rate(r["tuples_per_s"])


def target_line(g: dict) -> str:
    verdict = "MET" if g["met"] else "NOT MET"
    got = "error" if g["measured"] is None else fmt_rate(g["measured"])
    why = f" ({g['why']})" if g.get("why") else ""
    return f"target {g['operator']}: >= {fmt_rate(g['target'])} tuples/s, measured {got} -> {verdict}{why}"


def print_table(rows: list[dict], targets: list[dict], meta: dict) -> None:
    title = (f"replistream core operators: n={meta['n']:,} tuples, batch={meta['batch']:,}, "
             f"best of {meta['reps']}, one core")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None
    if Console is not None:
        t = Table(title=title)
        t.add_column("operator")
        t.add_column("tuples/s", justify="right")
        t.add_column("notes")
        for r in rows:
            t.add_row(r["operator"], rate_cell(r), r["notes"])
        con = Console(width=max(200, Console().width))
        con.print(t)
        for g in targets:
            con.print(target_line(g), style="bold green" if g["met"] else "bold red", markup=False)
        return
    print(title)
    w = max(len(r["operator"]) for r in rows)
    print(f"{'operator':<{w}}  {'tuples/s':>9}  notes")
    for r in rows:
        print(f"{r['operator']:<{w}}  {rate_cell(r):>9}  {r['notes']}")
    for g in targets:
        print(target_line(g))


def profile(case: Case, top: int) -> None:
    import cProfile
    import pstats

    run(case.make(), case.items[:20])
    op = case.make()
    pr = cProfile.Profile()
    pr.enable()
    run(op, case.items)
    pr.disable()
    st = pstats.Stats(pr, stream=sys.stdout).strip_dirs()
    print(f"== cProfile: {case.name} ({len(case.items)} items) ==")
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="tuples per workload (default 1M)")
    ap.add_argument("--batch", type=int, default=10_000, help="tuples per batch (default 10k)")
    ap.add_argument("--quick", action="store_true", help="n = 100k (a few seconds)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions; the best is reported")
    ap.add_argument("--punct-every", type=int, default=10, help="batches per input between punctuations")
    ap.add_argument("--join-punct-every", type=int, default=2,
                    help="batches per input between punctuations for the Join (bounds its buffers)")
    ap.add_argument("--df-lag", type=int, default=1,
                    help="DuplicateFilter: channel c lags c*DF_LAG batches behind channel 0 (0 = lockstep)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", default=None, help="run the cases whose name contains this (case-insensitive)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--profile", default=None, metavar="NAME",
                    help="cProfile one run of the case(s) whose name contains NAME, instead of timing")
    ap.add_argument("--top", type=int, default=25, help="rows of profile output")
    args = ap.parse_args(argv)
    if args.quick:
        args.n = 100_000

    cases = build_cases(args.n, args.batch, args.punct_every, args.join_punct_every, args.df_lag, args.seed)
    sel = args.profile or args.only
    if sel:
        cases = [c for c in cases if sel.lower() in c.name.lower()]
        if not cases:
            ap.error(f"no case matches {sel!r}")
    if args.profile:
        for c in cases:
            profile(c, args.top)
        return 0

    rows = []
    for c in cases:
        try:
            t, op, outs = time_case(c, args.reps, warmup_items=20)
        except Exception as e:  # a broken operator should not hide the other figures
            rows.append({"operator": c.name, "tuples_per_s": None, "ok": False,
                         "notes": f"ERROR {type(e).__name__}: {e}"})
            continue
        bad = check(c, op, outs)
        del outs
        notes = c.notes(op, t)
        rows.append({"operator": c.name, "tuples_per_s": c.work / t, "seconds": t, "tuples": c.work,
                     "ok": bad is None, "notes": notes if bad is None else f"CHECK FAILED: {bad}; {notes}",
                     **c.extra(op, t)})
        if not args.json:
            print(f"  {c.name}: {fmt_rate(c.work / t)} tuples/s ({t:.3f} s){'' if bad is None else ' CHECK FAILED'}",
                  file=sys.stderr)
    targets = []
    for r in rows:
        if r["operator"] in TARGETS:
            goal, got = TARGETS[r["operator"]], r["tuples_per_s"]
            g = {"operator": r["operator"], "target": goal, "measured": got,
                 "met": bool(r["ok"] and got is not None and got >= goal)}
            if not r["ok"]:
                g["why"] = "operator output wrong or errored"
            targets.append(g)
    meta = {"n": args.n, "batch": args.batch, "reps": args.reps, "punct_every": args.punct_every,
            "join_punct_every": args.join_punct_every, "df_lag": args.df_lag, "seed": args.seed,
            "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", "bench/core.py"] + (sys.argv[1:] if argv is None else list(argv))),
            "machine": machine(), "replistream": code_version()}
    if args.json:
        print(json.dumps({**meta, "results": rows, "targets": targets}, indent=2))
    else:
        print_table(rows, targets, meta)
        rv = meta["replistream"]
        if rv.get("modified"):
            print(f"note: replistream at {rv['path']} differs from git HEAD {rv.get('git_head')}: "
                  f"{', '.join(rv['modified'])}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Recorded runs behind the timings docs/ quotes (issue #31): one subcommand per figure.

    python bench/records.py summary-join      # docs/handover.md: joining a Summary window's ~300,000 blocks
    python bench/records.py liveness          # docs/reliability.md: both replicas killed behind the back -> RunFailed
    python bench/records.py repair            # docs/reliability.md: crash to the replacement's first output
    python bench/records.py rebalance         # docs/placement.md: the load loop's move with a fluid transfer
    python bench/records.py parity            # docs/experiments.md: Ray vs simulator latency (Fig. 1, k=2)
    python bench/records.py quick-suite       # README.md: the quick test subset, timed once

Run it from an export of a commit (other engineers edit the working tree meanwhile)::

    git archive HEAD replistream bench tests pyproject.toml | tar -x -C DIR && git rev-parse --short HEAD > DIR/.export_commit
    cd DIR && PYTHONPATH=DIR python bench/records.py repair --out /path/to/clone/docs/experiments/...

Each prints its figures and writes ``docs/experiments/<name>.json`` (``--out`` to change it) with
``date`` (from ``date -u``), ``machine`` (cores, CPU model, RAM, versions), ``load`` (the 1-minute
load average at the start and end of the measurement: this 2-core machine is shared with other
engineers' test runs), the exact ``command``, the ``figures`` as a page quotes them, and the raw
measurements. A record says what it measured; a page cites it (tests/cli/test_docs_figures.py).
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import gc
import json
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

S = 1_000_000


# -- the record ----------------------------------------------------------------------------------

def date_utc() -> str:
    return subprocess.run(["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True).stdout.strip()


def machine() -> str:
    cpu, mem = "unknown CPU", "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 ** 2:.1f} GiB"
    try:
        import ray
        ray_v = f", Ray {ray.__version__}"
    except ImportError:
        ray_v = ""
    return (f"{len(os.sched_getaffinity(0))} cores ({os.cpu_count()} CPUs), {cpu}, {mem} RAM, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"numpy {np.__version__}{ray_v}")


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def commit() -> str:
    """The code measured: HEAD (and what is uncommitted), or the commit an export was made from."""
    marker = os.path.join(ROOT, ".export_commit")
    if os.path.exists(marker):
        sha = open(marker).read().strip()
        return (f"{sha}, measured from an export (git archive {sha} replistream bench tests pyproject.toml | tar -x "
                f"-C DIR; cd DIR; PYTHONPATH=DIR python bench/records.py ...) so that other engineers' edits of the "
                f"working tree could not leak in")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "replistream", "bench", "tests"], cwd=ROOT,
                           capture_output=True, text=True).stdout.split("\n")
    dirty = [line[3:] for line in dirty if line.strip()]
    return head + (f" + uncommitted changes of other engineers in: {', '.join(dirty)}" if dirty else "")


class Record:
    """Opens a measurement (date, load at the start) and writes it with its figures."""

    def __init__(self, name: str, what: str, out: str | None):
        self.start = date_utc()
        dated = name if name == "quick_suite" else f"{name}_{self.start[:10]}"
        self.path = out or os.path.join(ROOT, "docs", "experiments", f"{dated}.json")
        self.what = what
        self.load_start = load1()
        self.commit = commit()
        self.command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])

    def write(self, figures: dict, raw, note: str = "") -> dict:
        end, load_end = date_utc(), load1()
        rec = {
            "what": self.what,
            "date": self.start[:10],
            "time": f"{self.start} - {end}",
            "machine": machine(),
            "load": (f"1-minute load average {self.load_start} at the start, {load_end} at the end; the machine "
                     f"is shared: other engineers' test runs were running at the same time{note}"),
            "command": self.command,
            "commit": self.commit,
            "figures": figures,
            "raw": raw,
        }
        with open(self.path, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
        print(json.dumps({k: rec[k] for k in ("date", "time", "load", "command", "figures")}, indent=1))
        print(f"written: {os.path.relpath(self.path, ROOT)}")
        return rec


def ms(x: float) -> str:
    return f"{x:.0f} ms"


def span(values, unit: str, digits: int = 0) -> str:
    lo, hi = round(min(values), digits), round(max(values), digits)
    f = (lambda v: f"{v:.{digits}f}") if digits else (lambda v: f"{v:.0f}")
    return f"{f(lo)} {unit}" if f(lo) == f(hi) else f"{f(lo)}-{f(hi)} {unit}"


# -- summary-join: docs/handover.md ----------------------------------------------------------------

def summary_join(a) -> int:
    """The Summary window case of bench/handover.py (300,000 tuples, 10,000 groups, median): how many
    value blocks its windows hold, how long joining them takes (the checkpoint's ``_join_parts``), and the
    whole checkpoint at 0 and 12 bits."""
    from handover import build_case, fill  # bench/handover.py

    from replistream.operators import aggregate

    rec = Record(a.name or "record_summary_join", "bench/handover.py's Summary case (a tumbling window, 10,000 "
                 "groups, a median Summary; 300,000 input tuples in 10,000-tuple batches): the value blocks its "
                 "windows keep, the time to join them (operators/aggregate.py _join_parts, the core of the "
                 "checkpoint), and the whole checkpoint (core.checkpoint(bits)); every repetition, in ms", a.out)
    q, node, feeds, p = build_case("time_window_summary", a.tuples, 0.1)
    core = fill(q, node, feeds, p)
    calls = []
    orig = aggregate._join_parts

    def timed(parts):
        t = time.perf_counter()
        out = orig(parts)
        calls.append((len(parts), time.perf_counter() - t))
        return out

    aggregate._join_parts = timed
    raw = {"tuples": a.tuples, "reps": a.reps, "checkpoint_ms": {}, "join_ms": {}, "blocks": None}
    try:
        for bits in (0, 12):
            cks, joins = [], []
            for _ in range(a.reps):
                gc.collect()
                calls.clear()
                t = time.perf_counter()
                core.checkpoint(bits)
                cks.append(1e3 * (time.perf_counter() - t))
                joins.append(1e3 * sum(dt for _, dt in calls))
                raw["blocks"] = sum(n for n, _ in calls)
            raw["checkpoint_ms"][bits] = [round(x, 1) for x in cks]
            raw["join_ms"][bits] = [round(x, 1) for x in joins]
    finally:
        aggregate._join_parts = orig
    allj = raw["join_ms"][0] + raw["join_ms"][12]
    figures = {
        "value blocks joined": f"{raw['blocks']:,}",
        "joining them, every repetition at 0 and 12 bits": span(allj, "ms"),
        "the whole checkpoint, 0 bits": span(raw["checkpoint_ms"][0], "ms"),
        "the whole checkpoint, 12 bits": span(raw["checkpoint_ms"][12], "ms"),
    }
    rec.write(figures, raw)
    return 0


# -- liveness: docs/reliability.md ---------------------------------------------------------------

def liveness(a) -> int:
    """tests/ray/test_failure_semantics.py's unannounced deaths: both replicas of a window killed
    behind the deployment's back (ray.kill) 1 event second apart; the time from the second kill to the
    run's RunFailed."""
    import ray

    from replistream import Query, RunFailed, deploy, seconds
    from replistream.engines.ray import init_ray
    from replistream.sources import Call, inject_at

    rec = Record(a.name or "record_liveness", "tests/ray/test_failure_semantics.py::test_replicas_that_die_on_their_"
                 "own_are_noticed_and_losing_all_ends_the_run_naming_them as a measurement: both replicas of the "
                 "window per_k killed with ray.kill (behind the deployment's back) 1 event second apart, input not "
                 "paced; seconds from the second kill to dep.run raising RunFailed", a.out)
    init_ray(num_cpus=2, object_store_memory=512 * 1024 * 1024)
    q = Query("semantics")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.filter(lambda b: b["v"] > 0, name="pick").window(size=seconds(2), by="k", name="per_k").sink("out")
    q.build()
    rng = np.random.default_rng(1)
    n, chunk = 300, 10
    ts = np.sort(rng.integers(0, seconds(30), n))
    k, v = rng.integers(0, 8, n), rng.normal(size=n)
    chunks = [{"ts": ts[i:i + chunk], "k": k[i:i + chunk], "v": v[i:i + chunk]} for i in range(0, n, chunk)]
    runs = []
    for i in range(a.runs):
        kills = {}

        def crash(label):
            def do(d):
                ray.kill(d.topology.handle(label), no_restart=True)
                kills[label] = time.time()
            return Call(do)

        mid = seconds(15)
        data = inject_at(inject_at(chunks, mid, crash("per_k#0")), mid + seconds(1), crash("per_k#1"))
        with deploy(q, servers=["boston", "london", "tokyo"], k=2) as dep:
            try:
                dep.run({"s": data}, timeout=600)
                runs.append({"run": i, "error": "no RunFailed"})
                continue
            except RunFailed as e:
                t = time.time()
                ok = "every replica of 'per_k' is lost" in str(e)
        runs.append({"run": i, "named": ok, "kill_to_error_s": round(t - kills["per_k#1"], 3),
                     "kills_apart_s": round(kills["per_k#1"] - kills["per_k#0"], 3)})
        print(runs[-1], file=sys.stderr, flush=True)
    good = [r["kill_to_error_s"] for r in runs if r.get("named")]
    if len(good) != len(runs):
        print("a run did not end with the RunFailed naming per_k", file=sys.stderr)
    figures = {f"second kill to RunFailed, {len(good)} runs": span(good, "s", 2),
               "median": f"{statistics.median(good):.2f} s"}
    rec.write(figures, {"runs": runs})
    return 0 if len(good) == len(runs) else 1


# -- repair: docs/reliability.md -----------------------------------------------------------------

def repair(a) -> int:
    """bench/repair.py (10 runs per case by default), summarised as docs/reliability.md quotes it."""
    rec = Record(a.name or "record_repair", "bench/repair.py: a keyed 1-s tumbling count over 10,000 keys, k=2 on "
                 "three local servers, 20,000 tuples per event second paced at 2x, replica 0 of the window taken "
                 "away at 40% of the stream (announced kill or ray.kill crash), with and without a warm spare; "
                 "'repair' is detection to the replacement's first output (seconds)", a.out)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        tmp = f.name
    cmd = [sys.executable, os.path.join(HERE, "repair.py"), "--runs", str(a.runs), "--seconds", str(a.seconds),
           "--json", tmp]
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    with open(tmp) as f:
        raw = json.load(f)
    os.unlink(tmp)
    runs = raw["runs"]

    def col(how, spares, key="repair"):
        return [r[key] for r in runs if r["how"] == how and r["spares"] == spares and key in r]

    figures, med, mx = {}, {}, {}
    for h in ("kill", "crash"):
        for sp in (0, 1):
            got = col(h, sp)
            n = sum(1 for r in runs if r["how"] == h and r["spares"] == sp)
            figures[f"{h}, spares={sp}: runs with a first output measured"] = f"{len(got)} of {n}"
            if got:
                med[h, sp], mx[h, sp] = statistics.median(got), max(got)
                figures[f"{h}, spares={sp}, repair median"] = f"{med[h, sp]:.2f} s"
                figures[f"{h}, spares={sp}, repair max"] = f"{mx[h, sp]:.2f} s"
    with_spare = [h for h in ("kill", "crash") if (h, 1) in med]
    without = [h for h in ("kill", "crash") if (h, 0) in med]
    if with_spare:
        figures["with a spare, median (kill, crash)"] = span([med[h, 1] for h in with_spare], "s", 2)
        figures["with a spare, at most"] = f"{max(mx[h, 1] for h in with_spare):.2f} s"
    if without:
        figures["without a spare, median (kill, crash)"] = span([med[h, 0] for h in without], "s", 1)
    exact = all(r["exact"] and r["repaired"] for r in runs)
    figures["every run exact and repaired"] = f"{exact} ({len(runs)} runs)"
    rec.write(figures, {"bench_repair_command": " ".join(cmd[1:]), **raw})
    return rc


# -- rebalance: docs/placement.md ----------------------------------------------------------------

def rebalance(a) -> int:
    """tests/ray/test_rebalance.py's scenario with the default fluid transfer: when the loop measures
    boston over the bound after the slow-down, and how long the move's transfer takes."""
    from replistream import Query, deploy
    from replistream.engines.ray import init_ray
    from replistream.engines.ray.control import GCConfig
    from replistream.sources import Call, inject_at
    from replistream.testing import assert_same_output, run_reference

    rec = Record(a.name or "record_rebalance", "tests/ray/test_rebalance.py's scenario (a keyed 1-s count, 500 keys, "
                 "5,000 tuples per event second, 16 s paced at 2x; per_k on boston and london; boston slowed 30x at "
                 "3 event seconds; the loop every 0.5 s, alpha 0.8) with the default fluid transfer: seconds from the "
                 "slow-down to the loop's move decision (and boston's measured load then), and the transfer's steps "
                 "and duration", a.out)
    init_ray(num_cpus=2, object_store_memory=512 * 1024 * 1024)
    q = Query("rebalance")
    s = q.source("s", {"k": "i8"}, punctuate_every=S // 10)
    s.window(size=S, by="k", aggs={"n": "count"}, name="per_k").sink("out")
    q.build()
    rng = np.random.default_rng(5)
    n, rate = 16 * 5_000, 5_000
    ts = np.sort(rng.integers(0, 16 * S, n))
    k = rng.integers(0, 500, n)
    step = rate // 20
    data = {"s": [{"ts": ts[i:i + step], "k": k[i:i + step]} for i in range(0, n, step)]}
    ref = run_reference(q, data)
    placement = {"entry": ["london", "tokyo"], "per_k": ["boston", "london"], "out": ["tokyo"]}
    runs = []
    for i in range(a.runs):
        slowed = {}

        def slow(d):
            slowed["t"] = d.now()
            d.slow_server("boston", 30.0)

        src = inject_at(data["s"], 3 * S, Call(slow))
        gc_cfg = GCConfig(gc=False, rebalance=True, utility_period_s=0.5, alpha=0.8, move_strategy="fluid")
        with deploy(q, servers=["boston", "london", "tokyo", "zurich"], k=2, placement=placement, gc=gc_cfg) as dep:
            res = dep.run({"s": src}, pace=2.0, timeout=300)
            run_end = dep.now()
            end = time.time() + 60
            while time.time() < end:  # a move the loop started may still be under way when the output is complete
                tr = dep.transfers()
                if tr and all(t.get("state") in ("complete", "failed") for t in tr):
                    break
                time.sleep(0.2)
            with dep.quiet():
                moves = [e for e in dep.gc_events() if e.get("kind") == "rebalance" and e["action"] == "move"]
                tr = dep.transfers()
        try:
            assert_same_output(ref.outputs["out"], res.outputs["out"])
            exact = True
        except AssertionError:
            exact = False
        r = {"run": i, "complete": res.complete, "exact": exact, "slowed_at_s": slowed.get("t"), "run_end_s": run_end,
             "moves": moves, "transfers": tr}
        if moves:
            m = moves[0]
            r["decision_after_slowdown_s"] = round(m["t"] - slowed["t"], 2)
            r["boston_load"] = m["server_loads"]["boston"]
            r["move"] = f"{m['replica']} {m['from']} -> {m['to']}"
        runs.append(r)
        print(json.dumps(r, default=str)[:2000], file=sys.stderr, flush=True)
    rec.write(rebalance_figures(runs), {"runs": runs}, )
    return 0


def rebalance_figures(runs) -> dict:
    figures = {}
    for r in runs:
        if "decision_after_slowdown_s" in r:
            figures[f"run {r['run']}: move decided after the slow-down"] = f"{r['decision_after_slowdown_s']:.1f} s"
            figures[f"run {r['run']}: boston's measured load"] = f"{r['boston_load']:.2f} of a core"
            figures[f"run {r['run']}: move"] = r["move"]
        for t in r.get("transfers") or []:
            if t.get("seconds") is not None:
                ended = t["started_s"] + t["seconds"]
                figures[f"run {r['run']}: transfer to {t['replica']}"] = (
                    f"{t['done']} of {t['steps']} steps ({t['strategy']}, {t['sends']} sends) in {t['seconds']:.1f} s, "
                    f"{'before' if ended <= r['run_end_s'] else 'ending after'} the run's output was complete")
            else:
                figures[f"run {r['run']}: transfer to {t['replica']}"] = f"{t['state']}: {t['done']} of {t['steps']} steps"
        figures[f"run {r['run']}: output exact"] = f"{r['exact']} (complete {r['complete']}, 1 run)"
    return figures


# -- parity: docs/experiments.md -----------------------------------------------------------------

def parity(a) -> int:
    """tests/sim/test_sim_parity.py as a measurement, ``--runs`` times: median and p90 latency on Ray
    and in the simulator, and their ratio."""
    from replistream.engines.ray import deploy, init_ray
    from replistream.scenario import Scenario
    from replistream.sim import Simulator
    from replistream.sim.traces import load_trace, month_model, write_trace
    from replistream.testing import assert_same_output, run_reference
    from replistream.workloads import fig1_inputs, fig1_query

    rec = Record(a.name or "record_sim_parity", "tests/sim/test_sim_parity.py as a measurement: the Fig. 1 query, "
                 "k=2, six servers, tokyo crashed at 6 s, one CSV latency trace (month_model(30, seed=7)), 12 s of "
                 "readings every 0.5 s, paced at 1x on Ray; latency of the alerts, ms", a.out)
    cities = ["boston", "london", "tokyo", "saopaulo", "sydney", "capetown"]
    plan = {"entry": ["boston", "london"], "loads": ["tokyo", "saopaulo"], "pings": ["saopaulo", "tokyo"],
            "correlate": ["sydney", "capetown"], "hot": ["capetown", "sydney"], "alerts": ["boston"]}
    crash = Scenario.from_dict({"events": [{"at": 6.0, "action": "kill_server", "server": "tokyo"}]})
    init_ray(num_cpus=2, object_store_memory=512 * 1024 * 1024)
    tmp = tempfile.mkdtemp()
    trace_path = os.path.join(tmp, "trace.csv")
    write_trace(month_model(30, seed=7), trace_path, names=cities, duration_s=30, step_s=5)
    trace = load_trace(trace_path)
    q = fig1_query(2, window_s=1.0, punctuate_s=0.5)
    data = fig1_inputs(2, duration_s=12, period_s=0.5, seed=3)
    ref = run_reference(q, data)
    runs = []
    for i in range(a.runs):
        sim = Simulator(q, plan, trace, scenario=crash).run(data)
        assert_same_output(ref.outputs["alerts"], sim.outputs["alerts"])
        with deploy(q, servers=cities, k=2, placement=plan, network=trace_path) as dep:
            res = dep.run(data, pace=1.0, scenario=crash, timeout=120)
            assert res.complete
            assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
            _, ray_ms = dep.latencies_ms("alerts")
        sim_ms = 1000 * np.asarray(sim.latencies("alerts")[1])
        r = {"run": i, "load1": load1(), "ray_median_ms": float(np.median(ray_ms)), "sim_median_ms": float(np.median(sim_ms)),
             "ray_p90_ms": float(np.percentile(ray_ms, 90)), "sim_p90_ms": float(np.percentile(sim_ms, 90)),
             "outputs": int(len(ray_ms))}
        r["ratio"] = r["ray_median_ms"] / r["sim_median_ms"]
        runs.append(r)
        print(r, file=sys.stderr, flush=True)
    figures = {
        "Ray median": span([r["ray_median_ms"] for r in runs], "ms"),
        "simulator median": span([r["sim_median_ms"] for r in runs], "ms"),
        "ratio of medians": span([r["ratio"] for r in runs], "", 2).strip(),
        "Ray p90": span([r["ray_p90_ms"] for r in runs], "ms"),
        "simulator p90": span([r["sim_p90_ms"] for r in runs], "ms"),
        "runs": f"{len(runs)} (every output equal to the reference)",
    }
    rec.write(figures, {"runs": runs})
    return 0


# -- quick-suite: README.md ----------------------------------------------------------------------

def quick_suite(a) -> int:
    """The quick test subset, once: wall time and pytest's summary line."""
    rec = Record(a.name or "quick_suite", "the quick test subset (tests not marked slow), run once, whole wall time "
                 "(/usr/bin/time -f %e) and pytest's summary line", a.out)
    cmd = ["/usr/bin/time", "-f", "%e", sys.executable, "-m", "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider"]
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    lines = p.stdout.strip().splitlines()
    summary = next((line for line in reversed(lines) if " in " in line and ("passed" in line or "failed" in line)), "?")
    timed = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "?"
    figures = {"wall (/usr/bin/time)": f"{float(timed):.0f} s" if timed.replace(".", "").isdigit() else f"{wall:.0f} s",
               "pytest's summary": summary.strip("= ")}
    rec.write(figures, {"pytest_exit": p.returncode, "wall_s": round(wall, 1), "time_s": timed,
                        "tail": lines[-30:]}, note=f" (pytest itself: {shlex.join(cmd)})")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn, runs in (("summary-join", summary_join, None), ("liveness", liveness, 5), ("repair", repair, 10),
                           ("rebalance", rebalance, 2), ("parity", parity, 3), ("quick-suite", quick_suite, None)):
        p = sub.add_parser(name, help=(fn.__doc__ or "").splitlines()[0])
        p.set_defaults(fn=fn)
        p.add_argument("--out", help="the record's path (default docs/experiments/record_<name>_<date>.json)")
        p.add_argument("--name", help=argparse.SUPPRESS)
        if runs:
            p.add_argument("--runs", type=int, default=runs)
        if name == "repair":
            p.add_argument("--seconds", type=int, default=10, help="event seconds per run (bench/repair.py's default 10)")
        if name == "summary-join":
            p.add_argument("--tuples", type=int, default=300_000)
            p.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())

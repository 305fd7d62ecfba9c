"""End-to-end throughput and per-replica CPU of the Ray runtime (a benchmark, not a test).

    python bench/runtime.py                  # full run, about 5 minutes
    python bench/runtime.py --quick          # smaller inputs, about 2 minutes
    python bench/runtime.py --json           # one JSON object on stdout
    python bench/runtime.py --only cpu       # just the CPU-by-replication table
    python bench/runtime.py --only keyed     # just the keyed-window throughput runs
    python bench/runtime.py --only whole     # just the whole-process Fig. 1 runs (fresh Pythons)

Everything runs on one local Ray instance started by this script
(``ray.init(address="local", num_cpus=2, ...)`` with replistream's
``RAY_SYSTEM_CONFIG`` where the measured version has it; reused by every run) with
zero emulated network delay (``deploy(..., network="zero")``). Each run
deploys a fresh deployment and calls ``dep.shutdown()`` afterwards. Inputs
are generated with a seeded numpy RNG before the deployment starts.

**1. Throughput** (input as fast as possible, ``pace=None``). The timed span
is ``dep.feed(inputs)`` + ``dep.wait()`` -- the body of ``dep.run`` without
its final ``collect()`` (which gathers metrics from every actor); it runs from
the first input chunk to the moment the driver sees every application holding
the end-of-stream punctuation (``wait`` polls every 50 ms). Throughput = input
tuples / that span. Deployment start-up (``deploy()``: actor processes,
links) is timed separately, and so is the *drain*: the time from the feeder
handing the last input chunk to Ray to END at the applications. Each run's
output is checked against an independent numpy computation.

* ``keyed``: one source ``events {key: i8}``, ``window(1 s, by="key",
  aggs={"n": "count"})``, 1000 keys drawn uniformly, timestamps 10 us apart
  (so 100k events per event-time second), 10k-tuple chunks.
* ``fig1``: ``workloads.fig1_query(10 servers, window 5 ms)`` over
  ``fig1_inputs(period 10 ms)`` (20 sources; every load reading joins with
  one ping). Chunks are ``--fig1-rows`` rows per source (default 5000). Up to
  commit c27ab14 the Join's probe enumerated every buffered tuple with an equal
  key before it tested the window, so its cost grew with rows-per-chunk squared
  and the default was 500 rows (10k-row chunks of 1M tuples did not finish in
  600 s); it now searches each probe tuple's window directly.

**0. Whole process** (``--only whole``; first, before this script starts its
own Ray): a child Python runs what a user's script does, ``import replistream``,
``init_ray()``, making a Fig. 1 input of ``--whole-steps`` readings per source
(default 18000: 360k tuples), ``deploy``, ``run``, ``shutdown``, and reports
each phase; the wall time runs from starting the child to its exit. k = 1 and
3 (or ``--ks`` with ``--only``); the output is checked as in part 1.

**2. CPU per replica by degree of replication** (Hwang Table I). Query:
sources ``a, b, c, d {key: i8, x: f8}``; ``union(a, b)`` -> ``filter(x >= 0)``
(passes everything, as in the paper) -> ``join`` with ``c`` on ``key``
(1000 keys, window 5 ms, about 500 outputs/s at the default rate) -> application
``joined``; ``d`` -> ``aggregate`` (count, 10 ms windows sliding every 1 ms,
as in the paper) -> application ``counts``. Each source emits ``--rate``
tuples/s (default 5k, so 20k tuples/s in total) for ``--duration`` s, paced
in real time (``pace=1.0``) in ``--chunk-ms`` chunks (default 500 ms; the
runtime's cost is mostly per packet: with 50 ms chunks at 30k tuples/s the
deployments fell behind the input on two cores, k=4 taking 26 s to process
3 s of input). For each k = 1..4 one deployment is
made (4 servers, so placement uses the same server labels throughout); the
script reads every actor's ``cpu_seconds`` (1) over an idle period as long as
the input before feeding -- the idle baseline (an actor's sender thread
costs CPU even without input; up to commit 5adbc9a it polled every ~2 ms) --
and (2) from just before the feed until every
application has END and every outbox is idle. "net" = run CPU minus the
actor's idle rate x the run's wall time. The table gives the mean per
replica of each operator and the ratio to k=1. Latency (reported, not a
target) is measured from the wall time of the output's timestamp (the feeder
releases a chunk at its first timestamp when it is not paced).

**3. Paced latency and peak memory** (``--only paced``): the keyed count of
part 1 (1 s tumbling windows, 10k keys, punctuation every 10 ms) fed at
``--paced-rates`` events/s (default 20k and 200k) for ``--duration`` s in real
time, for each k of ``--ks``. Latency of a window's count is its arrival minus
the wall time of its last instant (``ts = start + size - 1``), so it includes
one punctuation interval (a paced piece ends at the row that closes a window:
``chunk_ms`` does not add to it). A
thread samples, every 0.25 s, the resident memory (RSS) of the driver and of
every actor process of the deployment (Ray's own daemons, raylet, GCS and the
object store's shared memory are not counted; shared libraries are counted
once per process, so the sum is an upper bound), and their unique memory (USS)
every 2 s. Output is checked as in part 1.

To measure a pinned version of replistream rather than a working tree that is
being edited, put an export of it first on the path and run from outside the
repository, e.g. ``git archive HEAD replistream | tar -x -C /tmp/rs && cd /tmp &&
PYTHONPATH=/tmp/rs python /path/to/bench/runtime.py``; the JSON reports which
copy the driver (``replistream``) and the Ray workers (``replistream_in_workers``)
imported.

Noise: the figures are wall-clock and CPU measurements on a small machine;
``/proc/stat`` is sampled around every run and the JSON reports how busy
the whole machine was ("machine_busy_cores") next to what the deployment's
actors used, so contention from other processes can be seen.
"""
from __future__ import annotations

import os

# Keep any threaded numpy backend single-threaded (set before numpy loads; Ray workers inherit it).
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import datetime as _dt
import json
import resource
import sys
import threading
import time
import traceback

import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from core import code_version, fmt_rate, machine  # noqa: E402  (bench/core.py)

import replistream as rs  # noqa: E402
from replistream.workloads import fig1_inputs, fig1_query  # noqa: E402

KEYED_TARGET = 500_000  # events/s end to end at k=1 (stated by the project)
CPU_TARGETS = {"union": 1.5, "filter": 1.5, "join": 1.2, "aggregate": 1.2}  # CPU/replica at k=3 vs k=1
TABLE1_PAPER = {"union": 3.86, "filter": 3.50, "join": 1.22, "aggregate": 1.92}  # Hwang Table I, k=3 vs none
SERVERS = 4


# -- measurement helpers ------------------------------------------------------------
def proc_stat() -> tuple[float, float]:
    """(busy jiffies, wall time) of the whole machine."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return float(sum(vals[:8]) - idle), time.time()


def busy_cores(a: tuple[float, float], b: tuple[float, float]) -> float:
    hz = os.sysconf("SC_CLK_TCK")
    return (b[0] - a[0]) / hz / max(1e-9, b[1] - a[1])


def daemons_cpu() -> float | None:
    """CPU seconds used so far by this Ray instance's own processes (raylet, GCS, monitors), not its workers."""
    try:
        import ray

        total = 0.0
        for infos in ray._private.worker._global_node.all_processes.values():
            for info in infos:
                t = psutil.Process(info.process.pid).cpu_times()
                total += t.user + t.system
        return total
    except Exception:  # Ray's private API changed: leave it out (the report shows None)
        return None


def delta(a, b):
    return None if a is None or b is None else b - a


def driver_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def cpu_snapshot(dep) -> tuple[float, dict[str, float]]:
    """(wall time, {actor label: cpu_seconds since the actor started}) of every live actor."""
    import ray

    labels = [lbl for lbl in dep.handles if dep.alive.get(lbl)]
    t0 = time.time()
    stats = ray.get([dep.handles[lbl].stats.remote() for lbl in labels], timeout=60)
    t1 = time.time()
    return (t0 + t1) / 2, {lbl: float(s["cpu_seconds"]) for lbl, s in zip(labels, stats)}


def wait_quiet(dep, timeout: float = 30.0) -> bool:
    """Until every live actor's outboxes are empty (all sent packets processed), twice in a row."""
    import ray

    deadline, streak = time.time() + timeout, 0
    while time.time() < deadline:
        hs = [h for lbl, h in dep.handles.items() if dep.alive.get(lbl)]
        streak = streak + 1 if all(ray.get([h.idle.remote() for h in hs], timeout=30)) else 0
        if streak >= 2:
            return True
        time.sleep(0.05)
    return False


class Timed:
    """An input iterable that records when its first chunk was taken and when it ran out."""

    def __init__(self, chunks: list):
        self.chunks = chunks
        self.first: float | None = None
        self.last: float | None = None

    def __iter__(self):
        for c in self.chunks:
            if self.first is None:
                self.first = time.time()
            yield c
        self.last = time.time()


def group_cpu(cpu: dict[str, float], node: str) -> list[float]:
    return [v for lbl, v in sorted(cpu.items()) if lbl.startswith(node + "#")]


# -- workloads ------------------------------------------------------------------------
def keyed_count(name: str, ts: np.ndarray, keys: int, seed: int, punctuate_every: int):
    """A 1 s tumbling count by key over events at ``ts`` (random keys): the query, its input in
    10k-tuple chunks, and a check of the output against numpy (windows and the sum of counts)."""
    q = rs.Query(name)
    ev = q.source("events", {"key": "i8"}, punctuate_every=punctuate_every)
    ev.window(size=rs.seconds(1), by="key", aggs={"n": "count"}, name="window").sink("counts")
    q.build()
    n = len(ts)
    key = np.random.default_rng(seed).integers(0, keys, n).astype(np.int64)
    chunks = [{"ts": ts[a:a + 10_000], "key": key[a:a + 10_000]} for a in range(0, n, 10_000)]
    want_rows = len(np.unique((ts // rs.seconds(1)) * keys + key))

    def check(res) -> str | None:
        out = res.outputs["counts"]
        if len(out) != want_rows:
            return f"{len(out):,} windows out, expected {want_rows:,}"
        if int(out["n"].sum()) != n:
            return f"counts sum to {int(out['n'].sum()):,}, expected {n:,}"
        return None

    return q, {"events": chunks}, check, want_rows


def keyed_workload(n: int, keys: int, seed: int):
    q, data, check, want_rows = keyed_count("keyed", np.arange(n, dtype=np.int64) * 10, keys, seed, rs.seconds(1))
    desc = f"{n:,} events, {keys} keys, 1 s tumbling windows (100k events per event-time second), 10k-tuple chunks"
    return q, data, n, check, desc, want_rows


def fig1_workload(n_servers: int, steps: int, rows: int, seed: int):
    period_s, window_s = 0.01, 0.005
    q = fig1_query(n_servers=n_servers, window_s=window_s, punctuate_s=1.0)
    data = fig1_inputs(n_servers=n_servers, duration_s=steps * period_s, period_s=period_s, seed=seed, chunk=rows)
    n = sum(len(c["ts"]) for v in data.values() for c in v)
    w = int(round(window_s * 1e6))
    want = 0
    for i in range(n_servers):  # pairs |ts_load - ts_ping| < w, cpu > 0 and rtt > 0, counted independently
        lts = np.concatenate([c["ts"] for c in data[f"load_{i}"]])
        cpu = np.concatenate([c["cpu"] for c in data[f"load_{i}"]])
        pts = np.concatenate([c["ts"] for c in data[f"ping_{i}"]])
        rtt = np.concatenate([c["rtt_ms"] for c in data[f"ping_{i}"]])
        lts, pts = lts[cpu > 0], np.sort(pts[rtt > 0])
        want += int((np.searchsorted(pts, lts + w, "left") - np.searchsorted(pts, lts - w, "right")).sum())

    def check(res) -> str | None:
        got = len(res.outputs["alerts"])
        return None if got == want else f"{got:,} alerts, expected {want:,}"

    desc = (f"{n_servers} servers (20 sources), {n:,} readings, period 10 ms, join window 5 ms, "
            f"{rows} rows per chunk")
    return q, data, n, check, desc, want


def table1_workload(rate: float, duration: float, keys: int, seed: int, chunk_ms: int = 50):
    q = rs.Query("table1")
    sch = {"key": "i8", "x": "f8"}
    a, b, c, d = (q.source(s, sch, punctuate_every=rs.millis(chunk_ms)) for s in "abcd")
    u = q.union(a, b, name="union")
    f = u.filter(lambda bt: bt["x"] >= 0.0, name="filter")
    f.join(c, window=rs.millis(5), left_key="key", right_key="key", name="join").sink("joined")
    d.window(size=rs.millis(10), slide=rs.millis(1), aggs={"n": "count"}, name="aggregate").sink("counts")
    q.build()
    rng = np.random.default_rng(seed)
    n = int(rate * duration)
    gap = 1e6 / rate
    step = rs.millis(chunk_ms)
    inputs = {}
    for j, s in enumerate("abcd"):
        ts = (np.arange(n) * gap).astype(np.int64) + j  # sources offset by j us
        key = rng.integers(0, keys, n).astype(np.int64)
        x = rng.random(n)
        bounds = np.searchsorted(ts, np.arange(0, int(ts[-1]) + step + 1, step))
        inputs[s] = [{"ts": ts[lo:hi], "key": key[lo:hi], "x": x[lo:hi]}
                     for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
    return q, inputs, 4 * n


# -- part 0: the whole process ------------------------------------------------------------
def whole_child(k: int, steps: int, rows: int, seed: int) -> None:
    """In a fresh process: everything a user's script does, phase by phase, one JSON line on stdout."""
    t = {"process_start": time.time()}
    import replistream as rs_child
    from replistream.engines.ray import init_ray

    t["imported"] = time.time()
    init_ray(num_cpus=2)
    t["ray_started"] = time.time()
    q, data, n, check, _, _ = fig1_workload(10, steps, rows, seed)
    t["inputs_made"] = time.time()
    dep = rs_child.deploy(q, servers=SERVERS, k=k, network="zero")
    t["deployed"] = time.time()
    res = dep.run(data, timeout=600)
    t["ran"] = time.time()
    dep.shutdown()
    import ray

    ray.shutdown()
    t["shut_down"] = time.time()
    print(json.dumps({"k": k, "tuples": n, "error": check(res), "times": t}))


def run_whole(k: int, steps: int, rows: int, seed: int, log) -> dict:
    """One whole-process Fig. 1 run in a child Python: wall time from starting the interpreter to its
    exit, and the phases the child saw."""
    import subprocess

    cmd = [sys.executable, os.path.abspath(__file__), "--child-whole", str(k), "--fig1-steps", str(steps),
           "--fig1-rows", str(rows), "--seed", str(seed)]
    load = os.getloadavg()[0]
    t0 = time.time()
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    wall = time.time() - t0
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("{")]
    if cp.returncode != 0 or not lines:
        return {"k": k, "ok": False, "error": f"exit {cp.returncode}: {cp.stderr.strip().splitlines()[-1:]}",
                "wall_s": wall}
    r = json.loads(lines[-1])
    t = r["times"]
    phases = {"interpreter_and_import_s": t["imported"] - t0, "init_ray_s": t["ray_started"] - t["imported"],
              "make_inputs_s": t["inputs_made"] - t["ray_started"], "deploy_s": t["deployed"] - t["inputs_made"],
              "run_s": t["ran"] - t["deployed"], "shutdown_and_exit_s": t0 + wall - t["ran"]}
    row = {"k": k, "tuples": r["tuples"], "ok": r["error"] is None, "error": r["error"], "wall_s": wall,
           "without_inputs_s": wall - phases["make_inputs_s"], "phases": phases, "loadavg_before": load}
    log(f"  whole process fig1 k={k}: {r['tuples']:,} tuples, {wall:.2f} s from interpreter start to exit "
        f"({wall - phases['make_inputs_s']:.2f} s without making the inputs): "
        + ", ".join(f"{a[:-2]} {v:.2f}" for a, v in phases.items())
        + ("" if row["ok"] else f" FAILED: {r['error']}"))
    return row


# -- part 1: throughput ------------------------------------------------------------------
def run_throughput(name: str, make, k: int, timeout: float, log) -> dict:
    q, data, n, check, desc, want_out = make()
    timed = {s: Timed(v) for s, v in data.items()}
    row: dict = {"workload": name, "k": k, "tuples": n, "description": desc, "expected_out": want_out}
    t = time.perf_counter()
    dep = rs.deploy(q, servers=SERVERS, k=k, network="zero")
    row["startup_s"] = time.perf_counter() - t
    try:
        _, cpu0 = cpu_snapshot(dep)
        d0, st0, r0 = driver_cpu(), proc_stat(), daemons_cpu()
        t_start = time.time()
        dep.feed(timed, pace=None)
        ok = dep.wait(timeout)
        t_end = time.time()
        st1, d1, r1 = proc_stat(), driver_cpu(), daemons_cpu()
        res = dep.collect()
        row["run_with_collect_s"] = time.time() - t_start
        _, cpu1 = cpu_snapshot(dep)
        span = t_end - t_start
        last = max(tm.last for tm in timed.values() if tm.last is not None) if ok else None
        cpu = {lbl: cpu1[lbl] - cpu0.get(lbl, 0.0) for lbl in cpu1}
        bad = None if ok else f"timed out after {timeout:g} s"
        bad = bad or check(res)
        row.update({
            "ok": bad is None, "error": bad, "seconds": span, "tuples_per_s": n / span if ok else None,
            "drain_s": (t_end - last) if last else None,
            "outputs": int(sum(len(v) for v in res.outputs.values())),
            "actor_cpu_s": cpu, "actors_cpu_total_s": sum(cpu.values()), "driver_cpu_s": d1 - d0,
            "ray_daemons_cpu_s": delta(r0, r1), "machine_busy_cores": busy_cores(st0, st1), "loadavg_after": os.getloadavg()[0],
        })
    finally:
        dep.shutdown()
    log(f"  {name} k={k}: {n:,} tuples in {row.get('seconds', float('nan')):.2f} s = "
        f"{fmt_rate(row['tuples_per_s']) if row.get('tuples_per_s') else '-'} tuples/s, "
        f"start-up {row['startup_s']:.1f} s, drain {row.get('drain_s') or float('nan'):.2f} s"
        f"{'' if row.get('ok') else ' FAILED: ' + str(row.get('error'))}")
    return row


# -- part 3: paced latency and peak memory ------------------------------------------------
def paced_workload(rate: float, duration: float, keys: int, seed: int):
    n = int(rate * duration)
    ts = (np.arange(n) * (1e6 / rate)).astype(np.int64)
    q, data, check, _ = keyed_count("paced", ts, keys, seed, rs.millis(10))
    return q, data, n, check


class MemorySampler:
    """Peak memory of the driver and a deployment's actor processes, sampled in a thread."""

    def __init__(self, pids: list[int], every_s: float = 0.25, uss_every: int = 8):
        self.procs = [psutil.Process(p) for p in [os.getpid()] + list(pids)]
        self.every_s, self.uss_every = every_s, uss_every
        self.peak_rss = self.peak_uss = 0
        self.samples = 0
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            rss = uss = 0
            want_uss = self.samples % self.uss_every == 0
            for p in self.procs:
                try:
                    rss += p.memory_info().rss
                    if want_uss:
                        uss += p.memory_full_info().uss
                except psutil.NoSuchProcess:  # a process that ended: it holds nothing now
                    pass
            self.peak_rss = max(self.peak_rss, rss)
            if want_uss:
                self.peak_uss = max(self.peak_uss, uss)
            self.samples += 1
            time.sleep(self.every_s)

    def stop(self) -> dict:
        self._stop = True
        self.thread.join(timeout=5)
        return {"peak_rss_gb": self.peak_rss / 1e9, "peak_uss_gb": self.peak_uss / 1e9,
                "processes": len(self.procs), "samples": self.samples}


def run_paced(k: int, rate: float, duration: float, seed: int, log) -> dict:
    import ray

    q, data, n, check = paced_workload(rate, duration, keys=10_000, seed=seed)
    row: dict = {"k": k, "rate": rate, "tuples": n, "duration_s": duration}
    t = time.perf_counter()
    dep = rs.deploy(q, servers=SERVERS, k=k, network="zero")
    row["startup_s"] = time.perf_counter() - t
    try:
        labels = [lbl for lbl in dep.handles if dep.alive.get(lbl)]
        pids = [int(s["pid"]) for s in ray.get([dep.handles[l].stats.remote() for l in labels], timeout=60)]
        mem = MemorySampler(pids)
        res = dep.run(data, pace=1.0, timeout=duration + 120)
        row["memory"] = mem.stop()
        _, lat = dep.latencies_ms("counts")
        bad = None if res.complete else "incomplete"
        bad = bad or check(res)
        row.update({"ok": bad is None, "error": bad, "outputs": int(len(lat)),
                    "latency_ms": {p: float(np.percentile(lat, v)) for p, v in
                                   (("p50", 50), ("p99", 99), ("max", 100))} if len(lat) else {},
                    "loadavg_after": os.getloadavg()[0]})
    finally:
        dep.shutdown()
    lt, m = row.get("latency_ms", {}), row.get("memory", {})
    log(f"  paced k={k} at {fmt_rate(rate)} events/s: latency p50/p99/max "
        f"{lt.get('p50', float('nan')):.0f}/{lt.get('p99', float('nan')):.0f}/{lt.get('max', float('nan')):.0f} ms, "
        f"peak RSS {m.get('peak_rss_gb', float('nan')):.2f} GB, USS {m.get('peak_uss_gb', float('nan')):.2f} GB "
        f"({m.get('processes')} processes)" + ("" if row.get("ok") else f" FAILED: {row.get('error')}"))
    return row


# -- part 2: CPU per replica by degree of replication ---------------------------------------
def run_cpu(k: int, rate: float, duration: float, idle_s: float, chunk_ms: int, seed: int, log) -> dict:
    q, inputs, n = table1_workload(rate, duration, keys=1000, seed=seed, chunk_ms=chunk_ms)
    row: dict = {"k": k, "tuples": n, "rate_total": 4 * rate, "duration_s": duration}
    t = time.perf_counter()
    dep = rs.deploy(q, servers=SERVERS, k=k, network="zero")
    row["startup_s"] = time.perf_counter() - t
    try:
        time.sleep(1.0)  # let start-up work (connects, first stats) settle
        ti0, c0 = cpu_snapshot(dep)
        si0 = proc_stat()
        time.sleep(idle_s)
        ti1, c1 = cpu_snapshot(dep)
        si1, r1, d1 = proc_stat(), daemons_cpu(), driver_cpu()
        idle_wall = ti1 - ti0
        dep.feed(inputs, pace=1.0)
        ok = dep.wait(duration + 120)
        quiet = wait_quiet(dep)
        tr1, c2 = cpu_snapshot(dep)
        sr1, r2, d2 = proc_stat(), daemons_cpu(), driver_cpu()
        run_wall = tr1 - ti1
        m = dep.metrics()
        raw = {lbl: c2[lbl] - c1[lbl] for lbl in c2}
        idle_rate = {lbl: (c1[lbl] - c0[lbl]) / idle_wall for lbl in c1}
        net = {lbl: raw[lbl] - idle_rate[lbl] * run_wall for lbl in raw}
        ops = {}
        for node in ["union", "filter", "join", "aggregate", "entry"]:
            r, nt, il = group_cpu(raw, node), group_cpu(net, node), group_cpu(idle_rate, node)
            ops[node] = {"raw_s": float(np.mean(r)), "net_s": float(np.mean(nt)),
                         "idle_cpu_pct": 100 * float(np.mean(il)), "replicas": len(r),
                         "raw_per_replica": r}
        for app in q.sinks:
            ops[app] = {"raw_s": raw[app], "net_s": net[app], "idle_cpu_pct": 100 * idle_rate[app], "replicas": 1}
        lat = {}
        step = rs.millis(chunk_ms)
        for app in q.sinks:
            _, l_ms = dep.latencies_ms(app)  # arrival - ts (mapped to wall time)
            if len(l_ms):
                ts = dep.results(app)["ts"]
                # the feeder releases a chunk at its first timestamp, up to one chunk span before a tuple's own ts:
                # latency since the release of the chunk holding the output's timestamp
                rel = l_ms + (ts - (ts // step) * step) / 1000.0
                lat[app] = {p: float(np.percentile(rel, v)) for p, v in (("p50", 50), ("p99", 99))}
                lat[app].update({"ts_p50": float(np.percentile(l_ms, 50)), "ts_p99": float(np.percentile(l_ms, 99))})
        row.update({
            "ok": bool(ok and m["applications"]["joined"]["complete"] and m["applications"]["counts"]["complete"]),
            "quiet": quiet, "idle_wall_s": idle_wall, "run_wall_s": run_wall, "ops": ops,
            "delivered": {a: m["applications"][a]["delivered"] for a in q.sinks}, "latency_ms": lat,
            "machine_busy_cores_idle": busy_cores(si0, si1), "machine_busy_cores_run": busy_cores(si1, sr1),
            "actors_cpu_run_s": sum(raw.values()), "actors": len(raw), "ray_daemons_cpu_run_s": delta(r1, r2),
            "driver_cpu_run_s": d2 - d1, "overloaded": run_wall > 1.25 * duration + 1.0,
        })
    finally:
        dep.shutdown()
    o = row.get("ops", {})
    log(f"  cpu k={k}: " + ", ".join(f"{op} {o[op]['raw_s']:.2f}/{o[op]['net_s']:.2f} s"
                                     for op in ("union", "filter", "join", "aggregate") if op in o)
        + f" (raw/net per replica; run {row.get('run_wall_s', float('nan')):.1f} s, "
          f"machine busy {row.get('machine_busy_cores_run', float('nan')):.2f} cores)")
    return row


def cpu_table(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Per operator and k: mean raw / net CPU per replica and the ratio to k=1; target verdicts."""
    base = next((r for r in rows if r["k"] == 1 and "ops" in r), None)
    table, targets = [], []
    for op in ["union", "filter", "aggregate", "join", "entry"]:
        line = {"operator": op, "by_k": {}}
        for r in rows:
            if "ops" not in r:
                continue
            o = r["ops"][op]
            cell = {"raw_s": o["raw_s"], "net_s": o["net_s"], "idle_cpu_pct": o["idle_cpu_pct"]}
            if base is not None:
                cell["raw_ratio"] = o["raw_s"] / base["ops"][op]["raw_s"]
                cell["net_ratio"] = o["net_s"] / base["ops"][op]["net_s"] if base["ops"][op]["net_s"] > 0 else None
            line["by_k"][r["k"]] = cell
        table.append(line)
        if op in CPU_TARGETS:
            c3 = line["by_k"].get(3, {})
            goal = CPU_TARGETS[op]
            targets.append({"operator": op, "target_ratio": goal, "paper_ratio_k3": TABLE1_PAPER[op],
                            "raw_ratio": c3.get("raw_ratio"), "net_ratio": c3.get("net_ratio"),
                            "met_raw": c3.get("raw_ratio") is not None and c3["raw_ratio"] <= goal,
                            "met_net": c3.get("net_ratio") is not None and c3["net_ratio"] <= goal})
    return table, targets


# -- output ---------------------------------------------------------------------------------
def f2(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_report(out: dict) -> None:
    print(f"replistream Ray runtime benchmark ({out['command']}), {out['date_utc']}")
    if out.get("whole_process"):
        print("\n0. Whole process, Fig. 1 (a fresh Python: import, init_ray, make inputs, deploy, run, shut down)")
        for r in out["whole_process"]:
            ph = r.get("phases", {})
            print(f"  k={r['k']}: {r.get('tuples', 0):,} tuples, {r['wall_s']:.2f} s "
                  f"({f2(r.get('without_inputs_s'))} s without making inputs); "
                  + ", ".join(f"{a[:-2]} {v:.2f}" for a, v in ph.items())
                  + ("" if r.get("ok") else f"  FAILED: {r.get('error')}"))
    if out.get("throughput"):
        print("\n1. Throughput, pace=None (timed: feed -> END at the applications)")
        print(f"{'workload':<8} {'k':>2} {'tuples':>10} {'seconds':>8} {'tuples/s':>9} {'start-up s':>10} "
              f"{'drain s':>8} {'actor CPU s':>11} {'Ray CPU s':>9} {'busy cores':>10}  check")
        for r in out["throughput"]:
            print(f"{r['workload']:<8} {r['k']:>2} {r['tuples']:>10,} {f2(r.get('seconds')):>8} "
                  f"{fmt_rate(r['tuples_per_s']) if r.get('tuples_per_s') else '-':>9} {r['startup_s']:>10.1f} "
                  f"{f2(r.get('drain_s')):>8} {f2(r.get('actors_cpu_total_s'), '.1f'):>11} {f2(r.get('ray_daemons_cpu_s'), '.1f'):>9} "
                  f"{f2(r.get('machine_busy_cores')):>10}  {'ok' if r.get('ok') else 'FAILED: ' + str(r.get('error'))}")
        for d in sorted({(r["workload"], r["description"]) for r in out["throughput"]}):
            print(f"  {d[0]}: {d[1]}")
    if out.get("cpu"):
        print(f"\n2. CPU seconds per replica, paced input {out['meta']['rate_total']:,.0f} tuples/s for "
              f"{out['meta']['duration']:g} s in {out['meta']['chunk_ms']} ms chunks "
              f"(raw / net of idle baseline; ratio to k=1)")
        ks = sorted({r['k'] for r in out["cpu"] if "ops" in r})
        print(f"{'operator':<10} " + " ".join(f"{'k=' + str(k):>26}" for k in ks))
        for line in out["cpu_table"]:
            cells = []
            for k in ks:
                c = line["by_k"].get(k) or line["by_k"].get(str(k))  # str keys after a JSON round trip
                cells.append("-" if c is None else
                             f"{c['raw_s']:.2f}/{c['net_s']:.2f} ({f2(c.get('raw_ratio'))}x/{f2(c.get('net_ratio'))}x)")
            print(f"{line['operator']:<10} " + " ".join(f"{c:>26}" for c in cells))
        print("idle baseline, % of a core per replica: " + "; ".join(
            f"k={r['k']}: " + ", ".join(f"{op} {r['ops'][op]['idle_cpu_pct']:.1f}" for op in
                                      ("union", "filter", "join", "aggregate"))
            for r in out["cpu"] if "ops" in r))
        for r in out["cpu"]:
            if "ops" in r:
                lat = ", ".join(f"{a} p50 {v['p50']:.0f} / p99 {v['p99']:.0f}" for a, v in r["latency_ms"].items())
                print(f"  k={r['k']}: {r['actors']} actors, start-up {r['startup_s']:.1f} s, run wall {r['run_wall_s']:.1f} s"
                      f"{' (OVERLOADED: input lasted ' + format(r['duration_s'], 'g') + ' s)' if r['overloaded'] else ''}; "
                      f"CPU during run: actors {r['actors_cpu_run_s']:.1f} s, Ray daemons "
                      f"{f2(r['ray_daemons_cpu_run_s'], '.1f')} s, driver {r['driver_cpu_run_s']:.1f} s; machine busy "
                      f"{r['machine_busy_cores_idle']:.2f} cores idle / {r['machine_busy_cores_run']:.2f} run; "
                      f"delivered {r['delivered']}; latency ms since chunk release {lat}{'' if r['ok'] else ' INCOMPLETE'}")
    if out.get("paced"):
        print(f"\n3. Paced keyed count (10k keys, 1 s windows), {out['meta']['duration']:g} s of input at each rate")
        print(f"{'k':>2} {'events/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'peak RSS GB':>11} "
              f"{'peak USS GB':>11} {'processes':>9}  check")
        for r in out["paced"]:
            lt, m = r.get("latency_ms", {}), r.get("memory", {})
            print(f"{r['k']:>2} {fmt_rate(r['rate']):>9} {f2(lt.get('p50'), '.0f'):>7} {f2(lt.get('p99'), '.0f'):>7} "
                  f"{f2(lt.get('max'), '.0f'):>7} {f2(m.get('peak_rss_gb')):>11} {f2(m.get('peak_uss_gb')):>11} "
                  f"{m.get('processes', '-'):>9}  {'ok' if r.get('ok') else 'FAILED: ' + str(r.get('error'))}")
    print("\nTargets:")
    for g in out["targets"]:
        print("  " + g["text"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller inputs (about 2 minutes)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--only", choices=["whole", "keyed", "fig1", "cpu", "paced"], action="append",
                    help="run only these parts (repeatable)")
    ap.add_argument("--ks", default="1,2,3", help="degrees of replication for the throughput runs")
    ap.add_argument("--cpu-ks", default="1,2,3,4", help="degrees of replication for the CPU table")
    ap.add_argument("--keyed-n", type=int, default=None, help="events in the keyed-window run (default 2M; quick 500k)")
    ap.add_argument("--fig1-servers", type=int, default=10)
    ap.add_argument("--fig1-steps", type=int, default=None,
                    help="readings per source (default 10000 = 200k tuples; quick 1000)")
    ap.add_argument("--fig1-rows", type=int, default=5000, help="rows per Fig. 1 input chunk and source (see the docstring)")
    ap.add_argument("--rate", type=float, default=5000.0, help="tuples/s per source in the CPU runs (4 sources)")
    ap.add_argument("--chunk-ms", type=int, default=500, help="event-time span of one input chunk in the CPU runs")
    ap.add_argument("--duration", type=float, default=None, help="seconds of paced input (default 10; quick 3)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per throughput run")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--paced-rates", default="20000,200000", help="events/s of the paced latency runs")
    ap.add_argument("--whole-steps", type=int, default=18_000,
                    help="readings per source in the whole-process Fig. 1 runs (default 18000 = 360k tuples)")
    ap.add_argument("--child-whole", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_whole is not None:
        whole_child(args.child_whole, args.fig1_steps, args.fig1_rows, args.seed)
        return 0
    keyed_n = args.keyed_n or (500_000 if args.quick else 2_000_000)
    fig1_steps = args.fig1_steps or (1_000 if args.quick else 10_000)
    duration = args.duration or (3.0 if args.quick else 10.0)
    parts = set(args.only or ["whole", "keyed", "fig1", "cpu", "paced"])
    ks = [int(x) for x in args.ks.split(",")]
    cpu_ks = [int(x) for x in args.cpu_ks.split(",")]
    log = (lambda s: print(s, file=sys.stderr, flush=True))

    os.environ.pop("RAY_ADDRESS", None)  # always a fresh local instance, never someone else's cluster
    t_all = time.time()
    whole = []
    if "whole" in parts:  # before this process starts its own Ray: one Ray instance at a time
        for k in ks if args.only else [1, 3]:
            whole.append(run_whole(k, args.whole_steps, args.fig1_rows, args.seed, log))

    import ray

    # Ray prints raylet warnings (e.g. "N PYTHON worker processes have been started") on stdout even with
    # log_to_driver=False: send fd 1 to stderr while Ray runs, so stdout holds only the report / the JSON.
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)

    try:  # the Ray settings replistream starts Ray with (packets inline in calls), where this version has them
        from replistream.engines.ray import RAY_SYSTEM_CONFIG
        sysconf = {"_system_config": dict(RAY_SYSTEM_CONFIG)}
        sysconf_recorded = dict(RAY_SYSTEM_CONFIG)
    except ImportError:
        sysconf, sysconf_recorded = {}, None
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             **sysconf)

    @ray.remote(num_cpus=0)
    def _where() -> str:
        import replistream as _r
        return os.path.dirname(os.path.abspath(_r.__file__))

    worker_pkg = ray.get(_where.remote())
    thr, cpu_rows, paced = [], [], []
    try:
        for name, make in (("keyed", lambda: keyed_workload(keyed_n, 1000, args.seed)),
                           ("fig1", lambda: fig1_workload(args.fig1_servers, fig1_steps, args.fig1_rows, args.seed))):
            if name not in parts:
                continue
            for k in ks:
                try:
                    thr.append(run_throughput(name, make, k, args.timeout, log))
                except Exception as e:  # one broken run should not hide the others
                    traceback.print_exc()
                    thr.append({"workload": name, "k": k, "ok": False, "error": f"{type(e).__name__}: {e}",
                                "startup_s": float("nan"), "tuples": 0, "description": ""})
        if "cpu" in parts:
            for k in cpu_ks:
                try:
                    cpu_rows.append(run_cpu(k, args.rate, duration, duration, args.chunk_ms, args.seed, log))
                except Exception as e:
                    traceback.print_exc()
                    cpu_rows.append({"k": k, "ok": False, "error": f"{type(e).__name__}: {e}"})
        if "paced" in parts:
            for rate in [float(x) for x in args.paced_rates.split(",")]:
                for k in ks:
                    try:
                        paced.append(run_paced(k, rate, duration, args.seed, log))
                    except Exception as e:
                        traceback.print_exc()
                        paced.append({"k": k, "rate": rate, "ok": False, "error": f"{type(e).__name__}: {e}"})
    finally:
        ray.shutdown()
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)

    targets = []
    kr = next((r for r in thr if r["workload"] == "keyed" and r["k"] == 1), None)
    if kr is not None:
        got = kr.get("tuples_per_s")
        met = bool(kr.get("ok") and got and got >= KEYED_TARGET)
        targets.append({"name": "keyed window count k=1 >= 500k events/s", "measured": got, "met": met,
                        "text": f"keyed window count, k=1: >= {fmt_rate(KEYED_TARGET)} events/s end to end, "
                                f"measured {fmt_rate(got) if got else '-'} -> {'MET' if met else 'NOT MET'}"})
    table, cpu_targets = cpu_table(cpu_rows) if cpu_rows else ([], [])
    for g in cpu_targets:
        g["name"] = f"{g['operator']} CPU/replica k=3 <= {g['target_ratio']}x k=1"
        g["text"] = (f"{g['operator']}: CPU per replica at k=3 <= {g['target_ratio']}x k=1 "
                     f"(paper {g['paper_ratio_k3']}x): raw {f2(g['raw_ratio'])}x -> "
                     f"{'MET' if g['met_raw'] else 'NOT MET'}; net of idle {f2(g['net_ratio'])}x -> "
                     f"{'MET' if g['met_net'] else 'NOT MET'}")
        targets.append(g)
    out = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/runtime.py"] + (sys.argv[1:] if argv is None else list(argv))),
        "wall_s": time.time() - t_all, "machine": machine(), "replistream": code_version(),
        "ray": ray.__version__, "ray_system_config": sysconf_recorded, "replistream_in_workers": worker_pkg,
        "meta": {"keyed_n": keyed_n, "fig1_servers": args.fig1_servers, "fig1_steps": fig1_steps,
                 "fig1_rows": args.fig1_rows, "rate_per_source": args.rate, "rate_total": 4 * args.rate,
                 "duration": duration, "chunk_ms": args.chunk_ms, "servers": SERVERS, "seed": args.seed},
        "whole_process": whole, "throughput": thr, "cpu": cpu_rows, "cpu_table": table, "paced": paced,
        "targets": targets,
    }
    if args.json:
        print(json.dumps(out, indent=2, default=float))
    else:
        print_report(out)
        print(f"\ntotal wall time {out['wall_s']:.0f} s")
    return 0 if all(r.get("ok") for r in thr + cpu_rows + paced) else 1


if __name__ == "__main__":
    sys.exit(main())

"""How long a detached deployment runs without its control plane (issue #40): a benchmark, not a test.

    python bench/control_plane_loss.py                  # 2 runs per way of losing it, a table
    python bench/control_plane_loss.py --runs 3 --json --out docs/experiments/control_plane_loss.json

Each run deploys a detached keyed window query (k=2, 3 servers), feeds it 16 s of input paced
x4 from a list (kept by the deployment, so a new host can read it again), and loses the host
actor that serves (the process that holds the topology, feeder, failure monitor and control loop)
2 s in, once the second host stands by: SIGKILL of its process, or SIGSTOP (it stops answering;
the host standing by, or the coordinator, fences it after ``fail_after_s``). Measured: the seconds
from the loss to the deployment restored (its ``control_restored`` event, stamped by the host
that took over), to the user's client's ``status()`` answered by that host, the restore's own seconds, which host
took over, and whether the output equals the reference run. One Ray instance for every run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import time

import numpy as np


def query():
    from replistream import Query, seconds

    q = Query("control_plane_loss")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(2), by="k", aggs={"n": "count", "sv": ("v", "sum")}, name="per_k").sink("out")
    return q.build()


def inputs(n=3000, span_s=16, chunk=50, seed=1):
    from replistream import seconds

    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(span_s), n))
    k, v = rng.integers(0, 8, n), rng.normal(size=n)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, n, chunk)]}


def one(how: str, i: int, fail_after_s: float) -> dict:
    import ray

    from replistream import deploy
    from replistream.engines.ray.host import NAMESPACE
    from replistream.engines.ray.standby import serving_host
    from replistream.testing import as_multiset, run_reference

    q, data = query(), inputs()
    ref = run_reference(q, data)
    name = f"bench-cp-{how.lower()}-{i}"
    dep = deploy(q, servers=["boston", "london", "tokyo"], k=2, name=name, detached=True, progress=False,
                 fail_after_s=fail_after_s)
    try:
        second = standing_by(name)
        dep.feed(data, pace=4.0)
        time.sleep(2.0)
        info = ray.get(serving_host(name, NAMESPACE).process.remote(), timeout=60)
        pid = info["pid"]
        lost = time.time()
        os.kill(pid, signal.SIGKILL if how == "SIGKILL" else signal.SIGSTOP)
        while dep.status()["host"] == info["actor"]:  # the user's client, as a user's script asks
            time.sleep(0.01)
        answered = time.time() - lost
        ok = dep.wait(180)
        res = dep.collect()
        (ev,) = [e for e in res.events if e.get("event") == "control_restored"]
        (serves,) = [e for e in res.events if e.get("event") == "host_serves"]
    finally:
        dep.stop()
        if how == "SIGSTOP":
            try:
                os.kill(pid, signal.SIGKILL)  # fenced already; in case it was not
            except ProcessLookupError:
                pass
    exact = bool(ok) and as_multiset(res.outputs["out"]) == as_multiset(ref.outputs["out"])
    return {"how": how, "to_restored_s": round(ev["at"] - lost, 3), "to_answer_s": round(answered, 3),
            "restore_s": ev["seconds"], "by": serves["host"], "standby_ready": second is not None, "exact": exact}


def standing_by(name: str, timeout: float = 60.0):
    """Wait until the deployment's second host stands by (as it does from ~2 s after deploy()); its
    process, or None if none did within ``timeout``."""
    import ray

    from replistream.engines.ray.host import NAMESPACE
    from replistream.engines.ray.standby import pair

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            info = ray.get(ray.get_actor(pair(name)[1], namespace=NAMESPACE).process.remote(), timeout=30)
            if info["role"] == "standby":
                return info
        except ValueError:
            pass
        time.sleep(0.1)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--fail-after", type=float, default=4.0, help="deploy(fail_after_s=): when a stopped host is fenced")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="write the record (date, machine, load, command, figures) here")
    args = ap.parse_args()
    from replistream.engines.ray import init_ray

    init_ray()
    load = os.getloadavg()[0]
    rows = [one(how, i, args.fail_after) for how in ("SIGKILL", "SIGSTOP") for i in range(args.runs)]
    figures = {}
    for how in ("SIGKILL", "SIGSTOP"):
        xs = [r["to_restored_s"] for r in rows if r["how"] == how]
        figures[f"{how}: loss to control restored"] = f"{min(xs):.2f}-{max(xs):.2f} s"
        ys = [r["to_answer_s"] for r in rows if r["how"] == how]
        figures[f"{how}: loss to a client's call answered by the new host"] = f"{min(ys):.2f}-{max(ys):.2f} s"
        figures[f"{how}: the restore itself (median)"] = \
            f"{statistics.median(r['restore_s'] for r in rows if r['how'] == how):.2f} s"
    rec = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()})",
           "load": round(load, 2), "fail_after_s": args.fail_after,
           "command": "python bench/control_plane_loss.py --runs " + str(args.runs),
           "figures": figures, "runs": rows, "all_exact": all(r["exact"] for r in rows)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)
    if args.json:
        print(json.dumps(rec))
    else:
        print(f"{'how':8} {'loss -> restored':>18} {'loss -> answered':>18} {'restore':>9} {'by':>22} exact")
        for r in rows:
            print(f"{r['how']:8} {r['to_restored_s']:>16.2f} s {r['to_answer_s']:>16.2f} s {r['restore_s']:>7.2f} s "
                  f"{r['by']:>22} {r['exact']}")
    return 0 if rec["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

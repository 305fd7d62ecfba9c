"""``replistream up`` and ``replistream down`` timed as a user runs them (issue #44): a benchmark, not a test.

    python bench/cluster_updown.py                # 3 rounds, a table
    python bench/cluster_updown.py --runs 5 --json

Each round runs, in a HOME of its own (so it never stops or joins another cluster) and on a free port:

* ``up --num-cpus 2 --port P``: the time to its first line on stderr (``first_line_s``), to its return
  (``up_s``: the head has started; the warm pool fills afterwards), then how long the warm pool takes
  to be full (``warm_s``, from ``up``'s return to the pool's stats line in ``warm.log``);
* a script that joins the cluster with Ray's token and runs one task (``join_s``), so the cluster
  answered and authentication let this user in;
* ``down --port P`` (``down_s``) and whether any process of the head's process group is left.

The load average before each round is kept with it: the machine may be shared.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

CLI = [sys.executable, "-m", "replistream.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(home: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["HOME"] = home
    port = free_port()
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    up = subprocess.Popen(CLI + ["up", "--num-cpus", "2", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    first = up.stderr.readline()
    first_s = time.perf_counter() - t0
    rest_err = up.stderr.read()
    out = up.stdout.read()
    up.wait()
    up_s = time.perf_counter() - t0
    if up.returncode != 0:  # kept as a round of its own: the load may have been too high for Ray to start
        return {"load_1min": round(load, 2), "first_line_s": round(first_s, 2), "up_s": round(up_s, 2),
                "up_failed": (rest_err.strip().splitlines() or ["?"])[-1][:300], "joined": False, "down_ok": False,
                "processes_left": False}
    folder = os.path.join(home, ".replistream", "clusters", f"127.0.0.1-{port}")
    record = json.load(open(os.path.join(folder, "cluster.json")))
    t1 = time.perf_counter()
    warm = None
    while time.perf_counter() - t1 < 300:
        try:
            lines = [x for x in open(os.path.join(folder, "warm.log")).read().splitlines() if x.startswith("{")]
        except OSError:
            lines = []
        if lines:
            warm = json.loads(lines[-1])
            break
        time.sleep(0.2)
    warm_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    join = subprocess.run([sys.executable, "-c",
                           "from replistream.engines.ray import init_ray; import ray, sys; init_ray(address=sys.argv[1]);"
                           "print(ray.get(ray.remote(lambda: 42).remote()))", f"127.0.0.1:{port}"],
                          env=env, capture_output=True, text=True, timeout=300)
    join_s = time.perf_counter() - t2
    t3 = time.perf_counter()
    down = subprocess.run(CLI + ["down", "--port", str(port)], env=env, capture_output=True, text=True, timeout=300)
    down_s = time.perf_counter() - t3
    try:
        os.killpg(record["pid"], 0)
        left = True
    except ProcessLookupError:
        left = False
    return {"load_1min": round(load, 2), "first_line_s": round(first_s, 2), "up_s": round(up_s, 2),
            "warm_s": round(warm_s, 2), "warm_full": bool(warm and not warm.get("error")),
            "join_s": round(join_s, 2), "joined": join.stdout.strip() == "42", "down_s": round(down_s, 2),
            "down_ok": down.returncode == 0 and "is stopped" in down.stdout, "processes_left": left, "up_said": out.strip()[:80]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for _ in range(a.runs):
        home = tempfile.mkdtemp(prefix="rs-updown-")
        try:
            rows.append(one_round(home))
        finally:
            shutil.rmtree(home, ignore_errors=True)
    rec = {"benchmark": "cluster_updown", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{os.cpu_count()} cpus, {platform.processor() or platform.machine()}, "
                      f"Linux {platform.release()}, Python {platform.python_version()}",
           "command": "python bench/cluster_updown.py " + " ".join(sys.argv[1:]), "rounds": rows}
    if a.json:
        print(json.dumps(rec))
    else:
        cols = ["load_1min", "first_line_s", "up_s", "warm_s", "join_s", "down_s", "joined", "processes_left"]
        print(" | ".join(cols))
        for r in rows:
            print(" | ".join(str(r.get(c, "-")) for c in cols) + (f"  (up failed: {r['up_failed']})"
                                                                  if "up_failed" in r else ""))
    return 0 if all(r["joined"] and r["down_ok"] and not r["processes_left"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

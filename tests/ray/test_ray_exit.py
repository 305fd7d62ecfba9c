"""A script that started its own Ray ends quickly and leaves none of Ray's processes behind
(replistream/engines/ray/rayexit.py, issue #42: Ray's own exit took about 2 s here)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys
from replistream.engines.ray import init_ray
import replistream.engines.ray.rayexit as rayexit
own = rayexit.stop_in_waves
def traced(node, *a, **k):
    kinds = own(node, *a, **k)
    print("waves " + json.dumps(kinds), file=sys.stderr, flush=True)
    return kinds
rayexit.stop_in_waves = traced
init_ray()
import ray
node = ray._private.worker._global_node
print(json.dumps({kind: [i.process.pid for i in infos] for kind, infos in node.all_processes.items()}))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for every purpose here
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_script_that_started_ray_stops_every_ray_process_at_exit():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    waves = [ln for ln in done.stderr.splitlines() if ln.startswith("waves ")]
    assert waves, f"the exit hook did not stop Ray's processes: {done.stderr[-2000:]}"
    assert "raylet" in json.loads(waves[0][len("waves "):])
    deadline = time.monotonic() + 10  # (the reaper, stopped last by Ray's own stop, may take a moment)
    while time.monotonic() < deadline and any(_alive(p) for ps in pids.values() for p in ps):
        time.sleep(0.1)
    left = {kind: [p for p in ps if _alive(p)] for kind, ps in pids.items()}
    assert not any(left.values()), f"Ray processes left running after the script ended: {left}"

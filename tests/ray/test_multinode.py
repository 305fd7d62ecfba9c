"""Replication transparency on a multi-node Ray cluster, with a node removed mid-run.

The cluster needs its own Ray instance, so the check runs in a subprocess
(tests/ray/scripts/multinode_check.py) and the session's shared Ray is untouched."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "multinode_check.py"


@pytest.mark.slow
def test_multinode_cluster_node_removed_mid_run():
    out = subprocess.run([sys.executable, str(SCRIPT), "1"], capture_output=True, text=True, timeout=420)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    assert lines, f"no result; stderr:\n{out.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert result["misplaced_actors"] == {}, "actors must run on their server's Ray node"
    assert result["alive_nodes_after"] == result["nodes"] - 1
    assert [k["actor"] for k in result["killed"]], "the removed node hosted replicas"
    assert result["lost"] == 0 and result["extra"] == 0
    assert result["matches_reference"] and result["complete"]
    assert out.returncode == 0

"""Fixtures of the Ray tests that need a Ray cluster of their own."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

MULTINODE = Path(__file__).parent / "scripts" / "multinode_checks.py"


@pytest.fixture(scope="session")
def multinode_results():
    """Both checks of ``scripts/multinode_checks.py`` (min-cost placement on 3 Ray nodes, then a
    node removed mid-run from 4), run once in a process of their own: a cluster of several Ray
    nodes cannot share the session's Ray, and starting one costs tens of seconds.
    Returns ``(results by check name, return code, stderr)``."""
    out = subprocess.run([sys.executable, str(MULTINODE), "0"], capture_output=True, text=True, timeout=600)
    results = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[row.pop("check")] = row
    return results, out.returncode, out.stderr

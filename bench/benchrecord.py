"""What every benchmark record starts with, and how it is written (bench/paced.py, bench/latency.py).

A record (docs/experiments/*.json) says when, where, under what load and by which command it was
measured, then its ``figures`` as a page quotes them (tests/cli/test_docs_figures.py checks that).
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time


def record(load: str, **fields) -> dict:
    """``{"date", "machine", "load", "command", **fields}`` for this process's command line."""
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} ({os.cpu_count()} cores)",
            "load": load, "command": "python " + " ".join(sys.argv), **fields}


def write(path: str | None, rec: dict) -> None:
    """Write ``rec`` to ``path`` as JSON (nothing without a path) and say so on stderr."""
    if path:
        with open(path, "w") as f:
            json.dump(rec, f, indent=1)
        print(f"wrote {path}", file=sys.stderr)

"""Imports work from any folder, whatever the checkout is called (issue #44, point 1).

A checkout in a folder named ``replistream``, installed with ``pip install -e .`` as the README says,
then a script run from the checkout's parent: that folder (no ``__init__.py``) used to be taken for a
namespace package before the editable install's import hook was asked (``AttributeError: module
'replistream' has no attribute 'Query'``). Every module now lives under ``replistream/`` and the
editable install is a plain ``.pth`` line (pyproject.toml's ``package-dir``), so the package is found.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import numpy as np
    import replistream
    from replistream import Query, run_reference, seconds
    q = Query("from_parent"); s = q.source("s", {"k": "i8"}, punctuate_every=seconds(1))
    s.window(size=seconds(1), by="k", aggs={"n": "count"}).sink("out")
    ts = np.arange(0, seconds(2), 100_000)
    res = run_reference(q, {"s": [{"ts": ts, "k": ts % 3}]})
    print(replistream.__file__)
    print(len(res.outputs["out"]))
""")


def _copy_checkout(dest: Path) -> None:
    """A clone of this checkout (``git clone``) when it has no uncommitted change; else its files as git
    tracks them, uncommitted edits included; outside git, the tree without build output."""
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        if not dirty:
            subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], check=True, capture_output=True)
            return
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".venv", "build", "*.egg-info", "__pycache__"))
        return
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.mark.slow
def test_a_checkout_named_replistream_imports_from_its_parent(tmp_path):
    clone = tmp_path / "replistream"  # the folder a `git clone .../replistream` makes
    _copy_checkout(clone)
    venv = tmp_path / "venv"
    # no pip of its own (ensurepip takes seconds): this environment's pip installs into it (--python)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies come from this test's environment (a .pth line; its own .pth files are not read)
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    got = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "-e",
                          str(clone)], capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr
    (tmp_path / "script.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # a script file in the checkout's parent (its folder, holding the folder named replistream, is first on
    # sys.path), then the same code as `python -c` from the parent (the current folder first) and from the checkout
    runs = [([str(py), str(tmp_path / "script.py")], tmp_path), ([str(py), "-c", SCRIPT], tmp_path),
            ([str(py), "-c", SCRIPT], clone)]
    for cmd, cwd in runs:
        run = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, f"{cmd[1]} from {cwd}: {run.stderr}"
        where, outputs = run.stdout.split()
        assert Path(where) == clone / "replistream" / "__init__.py"
        assert int(outputs) > 0

"""The package's bytecode cache is written once where Python does not write it
(``PYTHONDONTWRITEBYTECODE=1`` or ``python -B`` with an editable install), so the actor processes
that import it read bytecode instead of compiling every module (engines/ray/bytecode.py; issue #42,
start-up). Each case runs in a fresh interpreter, on a small package of its own under tmp_path."""
import json
import os
import subprocess
import sys
import textwrap

import pytest


def _package(tmp_path, body="X = 1\n"):
    pkg = tmp_path / "pkg_bc"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text(body)
    return pkg


def _run(tmp_path, code: str, flags=("-B",), env_extra=None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "REPLISTREAM_BYTECODE")}
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=120, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


CACHE = """
import json
from pathlib import Path
from replistream.engines.ray.bytecode import cache_package_bytecode
print(json.dumps(cache_package_bytecode(Path("pkg_bc"))))
"""

# How many modules the import system compiled from source while importing pkg_bc.sub.mod.
COMPILED = """
import json, sys
import importlib._bootstrap_external as ext
compiled = []
real = ext.SourceLoader.source_to_code
def counting(self, data, path, **kw):
    compiled.append(path)
    return real(self, data, path, **kw)
ext.SourceLoader.source_to_code = counting
sys.path.insert(0, ".")
import pkg_bc.sub.mod
print(json.dumps([p.split("pkg_bc")[-1] for p in compiled if "pkg_bc" in p]))
"""


def test_without_bytecode_writing_the_cache_is_written_and_read(tmp_path):
    _package(tmp_path)
    assert len(_run(tmp_path, COMPILED)) == 3  # python -B: every module compiled at each import
    assert _run(tmp_path, COMPILED) == _run(tmp_path, COMPILED)  # ...and again: nothing was cached
    assert _run(tmp_path, CACHE) == "written"
    assert _run(tmp_path, COMPILED) == []  # read from the cache, though Python still writes none


def test_a_module_changed_after_is_compiled_again(tmp_path):
    pkg = _package(tmp_path)
    assert _run(tmp_path, CACHE) == "written"
    mod = pkg / "sub" / "mod.py"
    mod.write_text("X = 2\n")
    st = mod.stat()
    os.utime(mod, (st.st_atime, st.st_mtime + 10))  # (a later edit, whatever the clock's resolution)
    assert _run(tmp_path, COMPILED) == [os.sep + os.path.join("sub", "mod.py")]  # stale: its source wins
    assert _run(tmp_path, CACHE) == "written"
    assert _run(tmp_path, COMPILED) == []


def test_it_leaves_alone_what_is_not_its_to_do(tmp_path):
    pkg = _package(tmp_path)
    assert _run(tmp_path, CACHE, flags=()) == "python writes it"  # bytecode writing on: Python's own
    assert _run(tmp_path, CACHE, env_extra={"REPLISTREAM_BYTECODE": "0"}) == "off"
    assert not list(pkg.rglob("*.pyc"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only directory")
def test_a_read_only_package_is_left_alone(tmp_path):
    pkg = _package(tmp_path)
    pkg.chmod(0o555)
    try:
        assert _run(tmp_path, CACHE) == "read-only"
    finally:
        pkg.chmod(0o755)

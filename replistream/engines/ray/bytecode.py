"""The package's own bytecode cache, written once where Python will not write it.

Every replica is a Ray actor with a process of its own, and each imports about forty of
replistream's modules as it starts. Python compiles a module's source at import unless its
``__pycache__`` holds the bytecode, and it writes that cache only when bytecode writing is on:
with ``PYTHONDONTWRITEBYTECODE=1`` (set on this project's machines) or ``python -B``, and an
editable install (``pip install -e .``, which compiles nothing, where a plain ``pip install``
compiles every module), every actor compiled those modules anew: 81 ms of CPU per actor process
measured alone (``builtins.compile``, 39 modules), ten processes starting at once on two cores
for k=3 (issue #42, start-up). :func:`cache_package_bytecode` writes the package's cache as pip's
install does (:mod:`compileall`, only what is missing or older than its source); Python reads a
cache whatever its writing setting, and ignores one older than its source.
``REPLISTREAM_BYTECODE=0`` turns it off.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["cache_package_bytecode"]

#: The package whose cache is written: replistream itself.
PACKAGE = Path(__file__).resolve().parents[2]


def cache_package_bytecode(package: Path = PACKAGE) -> str:
    """Write ``package``'s bytecode cache if this interpreter does not write it itself
    (``sys.dont_write_bytecode``), the package's directory is writable and
    ``REPLISTREAM_BYTECODE`` is not ``0``. Returns what it did: ``"written"`` (every module's
    cache present and current; a few ms once it is), ``"python writes it"``, ``"off"``,
    ``"read-only"`` or ``"failed: ..."`` (a module that could not be compiled: it is compiled at
    import as before, nothing else changes).

    >>> cache_package_bytecode() in ("written", "python writes it", "off", "read-only")
    True
    """
    if os.environ.get("REPLISTREAM_BYTECODE", "1") == "0":
        return "off"
    if not sys.dont_write_bytecode:
        return "python writes it"
    if not os.access(package, os.W_OK):
        return "read-only"
    import compileall

    try:
        ok = compileall.compile_dir(str(package), quiet=2, legacy=False)
    except OSError as e:  # (a file that vanished or a directory made read-only meanwhile)
        return f"failed: {type(e).__name__}: {e}"
    return "written" if ok else "failed: a module did not compile"

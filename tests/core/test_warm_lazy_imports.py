"""numpy imports ``numpy.ma`` on the first ``np.unique`` of a process (a keyed state's first
snapshot: a rescale's first step) and ``numpy.lib.recfunctions`` on first use: on the data thread,
9 ms on a quiet core and 75 ms under profiling (issue #42 point 1). A data-path actor imports them
at set-up (``common.warm_lazy_imports``): the first snapshot then imports nothing."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from replistream.engines.ray.common import LAZY_IMPORTS, warm_lazy_imports

CHILD = """
import sys
import numpy as np
from replistream.operators.keyed import KeyedState
from replistream.engines.ray.common import warm_lazy_imports
if sys.argv[1] == "warm":
    warm_lazy_imports()
st = KeyedState({"n": "i8"}, bits=4)
st.upsert(np.arange(100, dtype=np.uint64) * 7919)
before = set(sys.modules)
st.snapshot(bins=[1, 2])
print(sorted(set(sys.modules) - before))
"""


def _imported_by_a_first_snapshot(mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_a_first_snapshot_imports_nothing_once_the_lazy_imports_are_warm():
    assert "numpy.ma" in _imported_by_a_first_snapshot("cold")  # (what the actors' set-up now pays instead)
    assert _imported_by_a_first_snapshot("warm") == "[]"


def test_warm_lazy_imports_imports_each_module():
    warm_lazy_imports()
    assert all(m in sys.modules for m in LAZY_IMPORTS)
    assert warm_lazy_imports() == []  # (nothing left to import)
    assert np.unique(np.array([2, 1, 2])).tolist() == [1, 2]

"""``import replistream`` stays light (issue #42, point 4: under 0.5 s on the project's 2-core machine).

The time itself is a benchmark (``python bench/startup.py --import-only``, recorded in docs/benchmarks.md),
never asserted here: the machine is shared. What is asserted is its cause: a fresh process that imports
replistream has not imported the heavy libraries, nor the parts of the package loaded on first use, and
every public name still resolves to the same object as from its own module.
"""
import json
import subprocess
import sys

import pytest

# Imported on first use only: each costs tens to hundreds of ms at import (networkx alone ~0.2 s).
HEAVY = ["networkx", "scipy", "pyarrow", "pandas", "ray", "pyspark", "raydp", "matplotlib", "rich", "tqdm",
         "numpy.ma", "numpy.lib.recfunctions"]
# The package's own parts that ``import replistream`` loads on first use (replistream/__init__.py: _LAZY).
LAZY_PARTS = ["replistream.engines", "replistream.engines.ray", "replistream.network", "replistream.replica",
              "replistream.scenario", "replistream.files", "replistream.sinks"]


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_replistream_imports_nothing_heavy():
    loaded = _fresh("import json, sys; import replistream; print(json.dumps(sorted(sys.modules)))")
    assert "replistream.query" in loaded  # the probe saw the import itself
    heavy = [m for m in HEAVY if m in loaded]
    assert not heavy, f"`import replistream` imports {heavy}; import them where they are used (issue #42)"
    parts = [m for m in LAZY_PARTS if m in loaded]
    assert not parts, f"`import replistream` imports {parts}; replistream/__init__.py loads them on first use"


def test_query_and_reference_run_need_no_ray_nor_arrow():
    """Building a query pulls in networkx (its graph) and running it on the reference engine the engines,
    but neither brings in Ray, pyarrow, pandas or SciPy."""
    loaded = _fresh(
        "import json, sys\n"
        "import replistream as rs\n"
        "q = rs.Query('q'); q.source('s', {'x': 'i8'}, punctuate_every=10).window(size=10, aggs={'t': ('x', 'sum')})"
        ".sink('out')\n"
        "out = rs.run_reference(q.build(), {'s': [{'ts': t, 'x': t} for t in range(20)]})\n"
        "assert out.outputs['out']['t'].tolist() == [45, 145], out.outputs['out']\n"
        "print(json.dumps(sorted(sys.modules)))")
    assert "networkx" in loaded and "replistream.engines" in loaded  # loaded on first use, as promised
    late = [m for m in ("ray", "pyarrow", "pandas", "scipy", "pyspark", "matplotlib") if m in loaded]
    assert not late, f"a query run on the reference engine imports {late}"


@pytest.mark.parametrize("name, module", [
    ("run_reference", "replistream.engines"), ("RunResult", "replistream.engines"),
    ("ReplicaCore", "replistream.replica"), ("Server", "replistream.network"),
    ("default_servers", "replistream.network"), ("Event", "replistream.scenario"),
    ("Scenario", "replistream.scenario"), ("FileSource", "replistream.files"), ("ParquetSink", "replistream.sinks"),
])
def test_lazy_names_are_the_modules_own(name, module):
    import importlib

    import replistream

    assert getattr(replistream, name) is getattr(importlib.import_module(module), name)


def test_subpackages_stay_attributes_in_a_fresh_process():
    """``import replistream`` used to import these; ``rs.engines`` etc. still work without importing them."""
    got = _fresh("import json, replistream as rs\n"
                 "from replistream import run_reference, Scenario\n"
                 "print(json.dumps([rs.engines.run_reference is run_reference, rs.scenario.Scenario is Scenario,"
                 " callable(rs.network.default_servers), rs.replica.ReplicaCore is rs.ReplicaCore,"
                 " 'engines' in dir(rs)]))")
    assert got == [True, True, True, True, True]


def test_the_placement_parts_the_ray_engine_imports_need_no_scipy_nor_networkx():
    """The Ray engine imports ``placement.nodes``, ``placement.policy`` and ``placement.servers`` as it loads
    (in the driver and in actor processes); SciPy (``coords``, ``spring``) and networkx (``model``'s check
    of the flows) are imported where they compute, and the package itself loads its names on first use."""
    loaded = _fresh("import json, sys\n"
                    "import replistream.placement as pl\n"
                    "import replistream.placement.nodes, replistream.placement.policy, replistream.placement.servers\n"
                    "assert pl.PlacementPolicy and pl.servers_from_rows and pl.ray_options\n"
                    "print(json.dumps(sorted(sys.modules)))")
    assert "replistream.placement.policy" in loaded
    late = [m for m in ("scipy", "networkx", "replistream.placement.spring") if m in loaded]
    assert not late, f"the placement parts the Ray engine imports pull in {late}"


def test_a_file_source_reads_its_schema_without_pandas(tmp_path):
    """Declaring a file source reads one file's schema with Parquet's, CSV's or Arrow's own reader,
    not ``pyarrow.dataset``, which imports pandas (about 0.2 s of a user's script)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    t = pa.table({"ts": [1, 2], "k": [3, 4], "v": [0.5, 1.5]})
    pq.write_table(t, tmp_path / "a.parquet")
    pacsv.write_csv(t, tmp_path / "a.csv")
    feather.write_feather(t, tmp_path / "a.feather")
    for name in ("a.parquet", "a.csv", "a.feather"):
        got = _fresh("import json, sys\n"
                     "from replistream import FileSource, Query\n"
                     f"s = FileSource({str(tmp_path / name)!r}, time='ts')\n"
                     "print(json.dumps({'pandas': 'pandas' in sys.modules, 'schema': str(s.schema())}))")
        assert not got["pandas"], f"FileSource({name}) imported pandas"
        assert "k" in got["schema"] and "v" in got["schema"], got

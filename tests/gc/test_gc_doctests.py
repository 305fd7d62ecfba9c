"""Docstring examples of replistream.gc: every public name has one.

The examples themselves run in tests/core/test_doctests.py, which walks gc/ too.
"""
import importlib
import pkgutil

import replistream.gc

MODULES = ["replistream.gc"] + sorted(m.name for m in pkgutil.walk_packages(replistream.gc.__path__, "replistream.gc."))


def test_every_gc_module_is_found():
    assert {"replistream.gc.snapshot", "replistream.gc.utility", "replistream.gc.garbage",
            "replistream.gc.revival"} <= set(MODULES)


def test_gc_modules_run_in_test_doctests():
    import importlib.util
    from pathlib import Path

    # by path: run alone, tests/core is not on sys.path (the whole suite put it there first)
    path = Path(__file__).parent.parent / "core" / "test_doctests.py"
    spec = importlib.util.spec_from_file_location("core_test_doctests", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ALL = mod.MODULES

    assert set(MODULES) <= set(ALL)


def test_every_public_name_has_an_example():
    for name in MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", []):
            obj = getattr(module, attr)
            if not (callable(obj) or isinstance(obj, type)) or attr.endswith("Fn"):
                continue  # constants and type aliases
            assert ">>>" in (obj.__doc__ or ""), f"{name}.{attr} has no docstring example"

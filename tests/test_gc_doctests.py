"""Docstring examples of replistream.gc.

tests/test_doctests.py walks ``replistream.__path__`` only, which does not
contain the folders mapped into the namespace (gc/, placement/, sim/); this
runs the gc modules' examples.
"""
import doctest
import importlib
import pkgutil

import pytest

import replistream.gc

MODULES = ["replistream.gc"] + sorted(m.name for m in pkgutil.walk_packages(replistream.gc.__path__, "replistream.gc."))


def test_every_gc_module_is_found():
    assert {"replistream.gc.snapshot", "replistream.gc.utility", "replistream.gc.garbage",
            "replistream.gc.revival"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_gc_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


def test_every_public_name_has_an_example():
    for name in MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", []):
            obj = getattr(module, attr)
            if not (callable(obj) or isinstance(obj, type)) or attr.endswith("Fn"):
                continue  # constants and type aliases
            assert ">>>" in (obj.__doc__ or ""), f"{name}.{attr} has no docstring example"

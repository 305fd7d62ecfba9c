"""Every docstring example in the package runs and holds."""
import doctest
import importlib
import pkgutil

import pytest

import replistream

MODULES = sorted(m.name for m in pkgutil.walk_packages(replistream.__path__, "replistream."))


@pytest.mark.parametrize("name", ["replistream"] + MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


def test_namespace_packages_import():
    import replistream.gc
    import replistream.placement
    import replistream.sim

    assert replistream.gc.__name__ == "replistream.gc"
    assert "collect" not in dir(replistream.gc)  # not Python's built-in gc

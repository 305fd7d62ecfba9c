"""Every docstring example in the package runs and holds."""
import doctest
import importlib
import pkgutil

import pytest

import replistream
import replistream.gc
import replistream.placement
import replistream.sim

PACKAGES = [replistream, replistream.placement, replistream.gc, replistream.sim]
MODULES = sorted({p.__name__ for p in PACKAGES} |
                 {m.name for p in PACKAGES for m in pkgutil.walk_packages(p.__path__, p.__name__ + ".")})


@pytest.mark.parametrize("name", MODULES)
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


def test_every_module_lives_under_the_package_folder():
    """pyproject.toml installs every package found under replistream/ and, for an editable install, puts the
    checkout on sys.path with one .pth line (issue #44: a folder named replistream in the current folder
    cannot shadow it). A Python package at the checkout's root would then be importable as a top-level name
    of its own, and a package-dir mapping would bring back setuptools' import hook: neither may come back."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"": "."}
    assert setuptools["packages"]["find"]["include"] == ["replistream", "replistream.*"]
    stray = sorted(d.name for d in root.iterdir() if (d / "__init__.py").exists() and d.name != "replistream")
    assert not stray, f"Python packages outside replistream/: {stray}"

"""Every docstring example in the package runs and holds."""
import doctest
import importlib
import pkgutil

import pytest

import replistream
import replistream.gc
import replistream.placement
import replistream.sim

# placement/, gc/ and sim/ live outside replistream/ (pyproject maps them), so walk each package
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


def test_every_subpackage_is_packaged():
    """pyproject.toml lists packages explicitly; a new subpackage must be added there or the wheel lacks it."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {"replistream" + "".join("." + p for p in d.relative_to(root / "replistream").parts)
               for d in (root / "replistream").rglob("*") if d.is_dir() and (d / "__init__.py").exists()}
    for folder in ("placement", "gc", "sim"):
        on_disk |= {f"replistream.{folder}" + "".join("." + p for p in d.relative_to(root / folder).parts)
                    for d in [root / folder, *(root / folder).rglob("*")]
                    if d.is_dir() and (d / "__init__.py").exists()}
    on_disk.add("replistream")
    assert on_disk <= listed, f"missing from pyproject.toml packages: {sorted(on_disk - listed)}"

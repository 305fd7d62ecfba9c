"""``dir()`` of the package and of the Ray engine lists every public name, the lazily loaded ones
included (#31: tab completion and ``help()`` missed ``deploy``, ``FileSource``, ...)."""
import importlib

import pytest


@pytest.mark.parametrize("name", ["replistream", "replistream.engines.ray"])
def test_dir_lists_every_public_name(name):
    module = importlib.import_module(name)
    missing = sorted(set(module.__all__) - set(dir(module)))
    assert not missing, f"dir({name}) lacks {missing}"


@pytest.mark.parametrize("name", ["replistream", "replistream.engines.ray"])
def test_every_listed_name_resolves(name):
    module = importlib.import_module(name)
    for attr in module.__all__:
        assert getattr(module, attr) is not None, f"{name}.{attr}"


def test_unknown_name_is_still_an_attribute_error():
    import replistream

    with pytest.raises(AttributeError, match="no attribute 'deplyo'"):
        replistream.deplyo  # noqa: B018

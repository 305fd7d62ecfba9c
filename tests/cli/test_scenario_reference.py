"""docs/scenarios.md, the scenario file reference, lists every action with the fields the code
requires and allows (#44 point 4), and its examples load."""
import json
import re
import tomllib
from pathlib import Path

from replistream.scenario import ACTIONS, Scenario, _OPTIONAL, _REQUIRED

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "scenarios.md").read_text()


def test_every_action_is_listed_with_its_fields():
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", PAGE, re.M)}
    assert set(ACTIONS) <= set(rows), sorted(set(ACTIONS) - set(rows))
    for action in ACTIONS:
        for name in (*_REQUIRED[action], *_OPTIONAL[action]):
            assert f"`{name}`" in rows[action], (action, name)


def test_the_examples_load_and_agree():
    toml = re.search(r"```toml\n(.*?)```", PAGE, re.S).group(1)
    js = re.search(r"```json\n(.*?)```", PAGE, re.S).group(1)
    a, b = Scenario.from_dict(tomllib.loads(toml)), Scenario.from_dict(json.loads(js))
    assert [e.to_dict() for e in a] == [e.to_dict() for e in b]
    a.validate(servers=["tokyo", "london", "boston", "saopaulo"])

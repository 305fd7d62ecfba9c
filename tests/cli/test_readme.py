"""The README tells the truth: its quickstart runs, its commands exist."""
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.slow  # a Ray run: 24 s of the quick subset (#31); the whole suite runs it
def test_quickstart_runs(ray_session, capsys):
    code = re.findall(r"```python\n(.*?)```", README, re.S)
    assert code, "README has no python quickstart"
    exec(compile(code[0], "README.md", "exec"), {})
    # what the README says it prints is what it prints
    shown = re.search(r"It prints[^\n]*\n\n```\n(.*?)```", README, re.S)
    assert shown, "README does not show what the quickstart prints"
    assert capsys.readouterr().out == shown.group(1)


def test_setup_commands_match_ci():
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert 'pip install -e ".[test]" && python -m pytest' in README
    assert 'pip install -e ".[test]" && python -m pytest' in ci
    assert "pip install -e . && replistream demo" in README
    assert "pip install -e . && replistream demo" in ci
    assert "python3 -m venv .venv && . .venv/bin/activate" in README
    assert "python3 -m venv .venv && . .venv/bin/activate" in ci

"""The Ray demo's verdict line says what its fault tolerance means (#31, item 8): how many more
server losses the run survives, not a bare number that reads as an alarm at 0."""
from __future__ import annotations

import pytest

from replistream.cli import _ray_notes, _verdict, fault_tolerance_meaning

LAT = {"all": {"p99": 120.0}, "before_failure": {"p99": None}, "after_failure": {"p99": None}}


def summary(tolerance) -> dict:
    return {"matches_reference": True, "complete": True, "outputs": 10, "reference_outputs": 10, "lost": 0,
            "duplicates": 0, "unexpected": 0, "failures": [], "latency_ms": LAT, "fault_tolerance": tolerance}


@pytest.mark.parametrize("tolerance, says", [
    (2, "fault tolerance 2 at the end: 2 more server losses survivable"),
    (1, "fault tolerance 1 at the end: 1 more server loss survivable"),
    (0, "fault tolerance 0 at the end: no further server loss survivable (an operator has one replica left: "
        "losing its server ends the run)"),
    (-1, "fault tolerance -1 at the end: an operator has no live replica left"),
])
def test_the_verdict_says_what_fault_tolerance_means(tolerance, says):
    line = _verdict(summary(tolerance), _ray_notes(summary(tolerance), gc=False))
    assert line.startswith("PASS: 10 alerts identical") and line.endswith("; " + says), line


def test_no_fault_tolerance_no_note():
    assert not any("fault tolerance" in n for n in _ray_notes(summary(None), gc=False))


@pytest.mark.parametrize("bad", ["1", 1.0, None, True])
def test_a_fault_tolerance_that_is_not_an_int_is_refused(bad):
    with pytest.raises(TypeError, match="fault tolerance must be an int"):
        fault_tolerance_meaning(bad)

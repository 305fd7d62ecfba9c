"""The Python API's progress line (#31, replistream.progress.Reporter), on a fake terminal: nothing
within the delay, nothing off a terminal, nothing after quiet(); past the delay, the phase, its bar
and the total time. Every wait is on an event the reporter sets, never a sleep."""
import io
import threading

import pytest

import replistream as rs
from replistream.progress import Reporter, is_quiet, reporter


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal, as stderr does in a console."""

    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def loud(monkeypatch):
    """Every test starts with the line allowed (the user's environment may say otherwise)."""
    monkeypatch.delenv("REPLISTREAM_QUIET", raising=False)
    before = rs.quiet(False)
    yield
    rs.quiet(before)


def test_a_call_that_ends_within_the_delay_writes_nothing():
    out = FakeTerminal()
    with Reporter("deploy", stream=out, delay=3600) as rep:
        rep.phase("starting replicas", total=10)
        rep.advance(10)
    assert rep.enabled and not rep.shown.is_set()
    assert out.getvalue() == ""


def test_past_the_delay_the_line_shows_the_phase_and_stays_with_the_total_time():
    out = FakeTerminal()
    with Reporter("deploy", stream=out, delay=0.0) as rep:
        rep.phase("starting replicas", total=10)
        assert rep.shown.wait(10)
        rep.advance(4)
        rep.update(detail="4 of 10 actors")
    text = out.getvalue()
    assert "deploy: starting replicas" in text
    assert "deploy: done in " in text  # the line that stays
    assert "\x1b[" in text  # drawn as a terminal line (rich), not plain text


def test_a_failing_call_leaves_failed_on_the_line():
    out = FakeTerminal()
    with pytest.raises(RuntimeError):
        with Reporter("run", stream=out, delay=0.0) as rep:
            rep.phase("feeding")
            assert rep.shown.wait(10)
            raise RuntimeError("boom")
    assert "run: failed" in out.getvalue()


def test_off_a_terminal_nothing_is_written_and_no_thread_starts():
    out = io.StringIO()
    before = threading.active_count()
    with Reporter("deploy", stream=out, delay=0.0) as rep:
        rep.phase("starting Ray")
        assert threading.active_count() == before
    assert not rep.enabled and out.getvalue() == ""


def test_quiet_turns_it_off_and_an_explicit_argument_wins():
    out = FakeTerminal()
    assert rs.quiet() is False and is_quiet()
    rep = reporter("deploy", stream=out, delay=0.0)
    rep.phase("starting Ray")
    rep.close()
    assert not rep.enabled and out.getvalue() == ""
    rep = reporter("deploy", progress=True, stream=out, delay=0.0)  # the call's own argument wins
    assert rep.enabled and rep.shown.wait(10)
    rep.close()
    assert "deploy: done in" in out.getvalue()


def test_the_environment_variable_turns_it_off(monkeypatch):
    monkeypatch.setenv("REPLISTREAM_QUIET", "1")
    rep = reporter("run", stream=FakeTerminal(), delay=0.0)
    rep.close()
    assert not rep.enabled


def test_progress_false_is_off_and_a_wrong_value_is_named():
    assert not reporter("run", progress=False, stream=FakeTerminal()).enabled
    with pytest.raises(ValueError, match="progress must be True, False or None"):
        reporter("run", progress="yes")


def test_close_is_idempotent_and_quick_when_never_shown():
    rep = reporter("deploy", stream=FakeTerminal(), delay=3600)
    rep.close()
    rep.close()
    assert rep.closed.is_set() and not rep.shown.is_set()

"""One progress display at a time on a terminal (#44 point 3): while the Python API's progress line
(a Reporter, e.g. deploy()'s) is on the terminal, a command's Heartbeat prints no "... phase: N s"
line into it; once the line is gone, the heartbeat speaks again. Waits on events, no sleeps."""
import io
import threading

from replistream.progress import Heartbeat, Reporter, showing


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_the_heartbeat_is_quiet_while_a_progress_line_shows():
    lines, beat = [], threading.Event()

    def emit(text):
        lines.append(text)
        if text.startswith("  ..."):
            beat.set()

    out = FakeTerminal()
    with Heartbeat(emit, every=0.05) as hb:
        with Reporter("deploy", stream=out, delay=0.0, enabled=True) as rep:
            assert rep.shown.wait(10) and showing()
            hb.say("demo: starting", phase="starting Ray and the replicas")
            # the heartbeat thread runs at least 4 rounds (every/2 each) while the line shows: none may print
            seen = threading.Event()
            rounds = [0]
            original = hb._lock

            class Counting:
                def __enter__(self):
                    rounds[0] += 1
                    if rounds[0] >= 8:
                        seen.set()
                    return original.__enter__()

                def __exit__(self, *a):
                    return original.__exit__(*a)

            hb._lock = Counting()
            assert seen.wait(30)
            hb._lock = original
            assert lines == ["demo: starting"] and not beat.is_set()
        assert not showing()
        assert beat.wait(30)  # the line is gone: the heartbeat speaks again
    assert lines[0] == "demo: starting" and lines[1].startswith("  ... starting Ray and the replicas:")

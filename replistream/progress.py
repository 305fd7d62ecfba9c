"""Progress for long commands, which are never silent for long (#17): :class:`Heartbeat`."""
from __future__ import annotations

import threading
import time

__all__ = ["Heartbeat"]


class Heartbeat:
    """Keeps a long command from going silent (#17): :meth:`say` prints a line and names the phase
    that runs until the next one; while nothing else is printed for ``every`` seconds, a background
    thread prints ``... <phase>: N s`` (with :attr:`detail`, e.g. a count, when set). :meth:`alive`
    tells it that another display (a live progress bar) shows progress meanwhile.

    >>> lines = []
    >>> with Heartbeat(lines.append, every=0.05) as hb:
    ...     hb.say("starting", phase="starting Ray"); time.sleep(0.3)
    >>> lines[0], lines[1].startswith("  ... starting Ray:")
    ('starting', True)
    """

    def __init__(self, emit, every: float = 4.0):
        self.emit, self.every = emit, every
        self.last = self.since = time.perf_counter()
        self.phase: str | None = None
        self.detail: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name="replistream-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        """Start beating (``with Heartbeat(...)`` does it); returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating; no line follows. Idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> "Heartbeat":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def say(self, text: str, phase: str | None = None) -> None:
        """Print ``text`` now; ``phase`` (if given) is what runs from now on."""
        with self._lock:
            self.emit(text)
            self.last = time.perf_counter()
            if phase is not None:
                self.phase, self.since, self.detail = phase, self.last, None

    def alive(self) -> None:
        """Progress is shown elsewhere right now: no heartbeat line is due."""
        self.last = time.perf_counter()

    def _beat(self) -> None:
        while not self._stop.wait(min(0.5, self.every / 2)):
            with self._lock:
                now = time.perf_counter()
                if self.phase and now - self.last >= self.every:
                    more = f", {self.detail}" if self.detail else ""
                    self.emit(f"  ... {self.phase}: {now - self.since:.0f} s{more}")
                    self.last = now

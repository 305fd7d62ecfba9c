"""Progress for long commands and API calls, which are never silent for long: :class:`Heartbeat` for the
commands (#17), :class:`Reporter` (:func:`reporter`, :func:`quiet`) for the Python API (#31)."""
from __future__ import annotations

import threading
import time

__all__ = ["Heartbeat", "Reporter", "reporter", "quiet", "is_quiet", "showing"]


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
            self._thread.join(5.0)  # it wakes on the event at once; never wait on it for ever

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
                if showing():  # a progress line of the Python API is on the terminal: it shows the progress (#44)
                    self.last = now
                    continue
                if self.phase and now - self.last >= self.every:
                    more = f", {self.detail}" if self.detail else ""
                    self.emit(f"  ... {self.phase}: {now - self.since:.0f} s{more}")
                    self.last = now


# -- the Python API's progress line (#31) -----------------------------------------------------------

_QUIET = [False]

#: The :class:`Reporter` lines on the terminal now: while one shows, a :class:`Heartbeat` prints no
#: "... phase: N s" line into it (#44: two progress displays on one line).
_SHOWING: set = set()


def showing() -> bool:
    """Whether a :class:`Reporter` line is on the terminal now (one progress display at a time).

    >>> showing()
    False
    """
    return any(not r.closed.is_set() for r in list(_SHOWING))


def quiet(on: bool = True) -> bool:
    """Turn the Python API's progress line off (``quiet()``) or back on (``quiet(False)``) for the
    whole process; returns the previous setting. The environment variable ``REPLISTREAM_QUIET=1``
    turns it off too. A call's own argument (``deploy(..., progress=True)``) wins over both.

    >>> import replistream as rs
    >>> before = rs.quiet(); rs.quiet(before)
    True
    """
    before = _QUIET[0]
    _QUIET[0] = bool(on)
    return before


def is_quiet() -> bool:
    """Whether :func:`quiet` or ``REPLISTREAM_QUIET`` turned the progress line off.

    >>> is_quiet() in (True, False)
    True
    """
    import os

    return _QUIET[0] or os.environ.get("REPLISTREAM_QUIET", "").strip().lower() not in ("", "0", "false", "no")


class Reporter:
    """The phase and progress of a long Python API call (``deploy()``, ``Deployment.run()``) as one
    line on stderr, so a script on a terminal is never silent for long; the commands have
    :class:`Heartbeat` instead.

    Nothing is written when the stream is not a terminal, when :func:`quiet` or ``enabled=False``
    turned it off, or when the call ends within ``delay`` seconds (2 s): a quick call stays
    silent. Past ``delay``, a ``rich`` line shows the phase, a bar when the phase has a total, and
    the time since the call began; when the call ends, the line stays with the total time.

    ``enabled``: ``None`` (on when ``stream`` is a terminal and not :func:`quiet`), ``True`` (on when
    ``stream`` is a terminal, whatever :func:`quiet` says) or ``False`` (off).

    >>> import io
    >>> class Tty(io.StringIO):
    ...     def isatty(self): return True
    >>> out = Tty()
    >>> with Reporter("deploy", stream=out, delay=0.0) as rep:
    ...     rep.phase("starting replicas", total=4); rep.advance(4)
    ...     _ = rep.shown.wait(5)
    >>> "deploy" in out.getvalue() and "starting replicas" in out.getvalue()
    True
    >>> with Reporter("deploy", stream=io.StringIO(), delay=0.0) as rep:  # not a terminal: nothing
    ...     rep.enabled
    False
    """

    def __init__(self, title: str, enabled: bool | None = None, stream=None, delay: float = 2.0):
        import sys

        self.title = title
        self.stream = sys.stderr if stream is None else stream
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = tty and (enabled is True or (enabled is None and not is_quiet()))
        self.delay = float(delay)
        self.shown = threading.Event()  # set once the line is on the terminal
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._name, self._total, self._done, self._detail = "starting", None, 0, None
        self._bar = self._task = None
        self._started = time.perf_counter()
        self._thread: threading.Thread | None = None

    # -- what callers use ---------------------------------------------------------------------
    def start(self) -> "Reporter":
        """Start the clock (``with Reporter(...)`` does it); the line appears ``delay`` s later."""
        self._started = time.perf_counter()
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._wait_then_show, name="replistream-progress", daemon=True)
            self._thread.start()
        return self

    def phase(self, name: str, total: float | None = None, detail: str | None = None) -> None:
        """What runs from now on; ``total`` (a count) gives the phase a bar, :meth:`advance` fills it."""
        with self._lock:
            self._name, self._total, self._done, self._detail = name, total, 0, detail
            self._render()

    def advance(self, n: float = 1) -> None:
        """``n`` more of the phase's total are done."""
        with self._lock:
            self._done += n
            self._render()

    def update(self, done: float | None = None, total: float | None = None, detail: str | None = None) -> None:
        """Set how much of the phase is done, its total, or a detail shown after it (e.g. a count)."""
        with self._lock:
            if done is not None:
                self._done = done
            if total is not None:
                self._total = total
            if detail is not None:
                self._detail = detail
            self._render()

    def close(self, summary: str | None = None) -> None:
        """The call ended: if the line is showing, it stays with ``summary`` (default: the total
        time); if it never showed, nothing is written. Idempotent."""
        self.closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)  # it wakes on the event at once; never wait on it for ever
        with self._lock:
            if self._bar is not None:
                took = time.perf_counter() - self._started
                text = summary or f"done in {took:.1f} s"
                self._bar.update(self._task, description=f"{self.title}: {text}", completed=1, total=1)
                self._bar.stop()
                self._bar = None
            _SHOWING.discard(self)

    def __enter__(self) -> "Reporter":
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        self.close("failed" if exc_type is not None else None)

    # -- the line -------------------------------------------------------------------------------
    def _wait_then_show(self) -> None:
        if self.closed.wait(self.delay):
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        console = Console(file=self.stream, force_terminal=True, stderr=self.stream is None)
        with self._lock:
            if self.closed.is_set():
                return
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                 TimeElapsedColumn(), console=console, transient=False, refresh_per_second=4,
                                 redirect_stdout=False, redirect_stderr=False)  # the user's prints stay theirs
            self._task = self._bar.add_task(self._description(), total=None, start=True)
            self._bar.tasks[0].start_time = self._bar.get_time() - (time.perf_counter() - self._started)
            self._render()
            self._bar.start()
            _SHOWING.add(self)
        self.shown.set()

    def _description(self) -> str:
        more = f" ({self._detail})" if self._detail else ""
        return f"{self.title}: {self._name}{more}"

    def _render(self) -> None:  # under self._lock
        if self._bar is not None:
            # drawn now, not at the next refresh: a short phase still shows once
            self._bar.update(self._task, description=self._description(), total=self._total, completed=self._done,
                             refresh=True)


def reporter(title: str, progress: bool | None = None, stream=None, delay: float = 2.0) -> Reporter:
    """A started :class:`Reporter` for an API call's ``progress`` argument (``None``: on a terminal
    unless :func:`quiet`; ``True``: on a terminal; ``False``: never). Close it when the call ends.

    >>> rep = reporter("deploy", progress=False); rep.enabled
    False
    >>> rep.phase("starting Ray"); rep.close()
    """
    if progress not in (None, True, False):
        raise ValueError(f"progress must be True, False or None (on a terminal unless replistream.quiet()), "
                         f"got {progress!r}")
    return Reporter(title, enabled=progress, stream=stream, delay=delay).start()

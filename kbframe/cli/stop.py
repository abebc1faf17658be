"""Ctrl-C and SIGTERM at any moment of a command: one line, exit 130 or 143.

Inside a run's window kbframe.run.jobstatus records the end (``status.json``
``interrupted``) and prints the run's line. Outside it (Python's imports, Hydra composing
the config or a sweep's next job, a sweeper's start, the sweep's end) :func:`install`'s
handlers do the rest:

* the signal is raised as KeyboardInterrupt (:class:`~kbframe.errors.Terminated` for
  SIGTERM) wherever the main thread is, and the command is noted as stopped;
* from then on only kbframe's own lines reach stderr: a library's error raised while it
  unwinds from the interrupt (an OmegaConf node left half made, Hydra's report of it) is
  not the user's business;
* :func:`finish` gives the command's exit status (130, 143) whatever the unwinding raised
  or returned, records ``interrupted`` for the job that Hydra had started but that had not
  recorded itself yet, and prints the command's line: ``kbframe: interrupted`` alone, or,
  when a sweep was running, one line naming the sweep directory and how to summarise what
  finished. A second signal while the first unwinds is ignored.
* an interrupt that Python loses is raised again (:func:`keep_interrupts`): a signal
  handler runs wherever the main thread is, also inside a weakref callback or a
  ``__del__`` (the garbage collector's), where Python prints the exception as "ignored"
  and goes on, and the run would end ``ok`` as if no signal had come.

This module imports nothing heavy: the command's entry (kbframe.cli.entry) installs the
handlers before Python imports Hydra, numpy or kbframe's layers.
"""
from __future__ import annotations

import datetime
import io
import os
import signal
import sys
import threading

from ..errors import Terminated

#: exit status of an interrupted command (128 + SIGINT) and of a terminated one (128 + SIGTERM)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

_stopped: int | None = None  # the signal that stopped the command
_quiet: "_OwnLinesOnly | None" = None
#: when the command started, as status.json records times (kbframe.run.jobstatus.now)
started_at = datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")
started_epoch = datetime.datetime.now().timestamp()


def install() -> None:
    """SIGINT and SIGTERM raise (KeyboardInterrupt, Terminated) and mark the command as
    stopped (main thread only: Python runs signal handlers there); a lost one is raised
    again (:func:`keep_interrupts`)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _handler)
        signal.signal(signal.SIGTERM, _handler)
        keep_interrupts()


#: seconds after which an interrupt Python lost is raised again
RERAISE_S = 0.001
_lost: "type[BaseException] | None" = None  # the interrupt to raise again


def keep_interrupts() -> None:
    """A KeyboardInterrupt (Terminated) raised by a signal handler in a place whose
    exceptions Python ignores (a weakref callback, ``__del__``: ``sys.unraisablehook``) is
    raised again :data:`RERAISE_S` later, from SIGALRM, in the main thread's own code. The
    hook is Python's default for every other exception."""
    signal.signal(signal.SIGALRM, _raise_lost)
    sys.unraisablehook = _unraisable


def _unraisable(u) -> None:
    global _lost
    if isinstance(u.exc_value, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
        _lost = type(u.exc_value)
        signal.setitimer(signal.ITIMER_REAL, RERAISE_S)
        return
    sys.__unraisablehook__(u)


def _raise_lost(signum, frame) -> None:
    global _lost
    lost, _lost = _lost, None
    if lost is not None:
        raise lost()


def _handler(signum, frame) -> None:
    global _stopped, _quiet
    if _stopped is not None:  # the first one is being handled: the command is ending
        return
    _stopped = signum
    _quiet = sys.stderr = _OwnLinesOnly(sys.stderr)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def reset() -> None:
    """Not stopped (a command's start; in-process callers run several)."""
    global _stopped, _quiet, started_at, started_epoch
    if _quiet is not None and sys.stderr is _quiet:
        sys.stderr = _quiet.inner
    _stopped, _quiet = None, None
    t = datetime.datetime.now().astimezone()
    started_at, started_epoch = t.isoformat(timespec="milliseconds"), t.timestamp()


def stopped() -> bool:
    """Whether a signal stopped the command."""
    return _stopped is not None


def raise_if_stopped() -> None:
    """Raise the interrupt again if a signal stopped the command: a library may have caught
    the one the handler raised and gone on (OmegaConf turns it into an error of its own,
    which Hydra's probe of the run mode swallows before it composes the config again), and
    a run must not start then (kbframe.cli.main)."""
    if _stopped is not None:
        raise Terminated() if _stopped == signal.SIGTERM else KeyboardInterrupt()


def code() -> int:
    return EXIT_TERMINATED if _stopped == signal.SIGTERM else EXIT_INTERRUPTED


def interrupted(e: BaseException) -> None:
    """Note an interrupt that reached kbframe some other way than :func:`install`'s handler
    (a handler of the run's own, a worker's): the command is stopped by it."""
    global _stopped, _quiet
    if _stopped is None:
        _stopped = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
        _quiet = sys.stderr = _OwnLinesOnly(sys.stderr)


class _OwnLinesOnly(io.TextIOBase):
    """stderr once the command is stopped: kbframe's lines (``kbframe: ...``) pass, the
    rest is dropped; counts the lines that passed."""

    def __init__(self, inner):
        self.inner = inner
        self.lines = 0
        self._last = False

    def write(self, s):
        ok = s.startswith("kbframe:") or (self._last and s == "\n")
        if ok:
            self.lines += s.startswith("kbframe:")
            self.inner.write(s)
        self._last = ok
        return len(s)

    def flush(self):
        try:
            self.inner.flush()
        except (OSError, ValueError):
            pass

    def isatty(self):
        return self.inner.isatty()

    def fileno(self):
        return self.inner.fileno()

    @property
    def encoding(self):
        return getattr(self.inner, "encoding", "utf-8")


def to(stream) -> None:
    """Once stopped, kbframe's lines go to ``stream`` (stderr itself, after a stand-in for
    it ends: kbframe.cli.hydra_errors), and stderr stays filtered."""
    if _quiet is not None:
        _quiet.inner = stream
        sys.stderr = _quiet


_sweep: str | None = None  # the sweep this process launched (kbframe.cli.callbacks)


def note_sweep(sweep_dir: str) -> None:
    """The sweep this process launches: named by a stop at any later moment, also one that
    escapes kbframe.cli.main (:func:`entry`)."""
    global _sweep
    _sweep = sweep_dir


def launched_sweep() -> str | None:
    return _sweep


def finish(sweep_dir: str | None, job_dir: str | None, job_started: str | None) -> int:
    """The stopped command's exit status, after its line (see the module doc).

    Args:
        sweep_dir: the sweep this process launches, if any.
        job_dir, job_started: the job directory Hydra started last in this process and
            when (kbframe.cli.callbacks), if any: recorded ``interrupted`` unless its
            ``status.json`` is a later run's own (an end it recorded itself).
    """
    if job_dir:
        _record(job_dir, job_started)
    if sweep_dir:
        for d in _job_dirs(sweep_dir):
            _record(d, None)
    what = "terminated (SIGTERM)" if _stopped == signal.SIGTERM else "interrupted"
    if sweep_dir:
        print(f"kbframe: {what}; summarise what finished with: python -m kbframe.report {sweep_dir}",
              file=sys.stderr)
    elif _quiet is None or _quiet.lines == 0:
        print(f"kbframe: {what}", file=sys.stderr)
    return code()


def hydra_began(job_dir: str) -> bool:
    """Whether Hydra wrote into ``job_dir/.hydra/`` since this command started."""
    try:
        d = os.path.join(job_dir, ".hydra")
        return any(os.stat(os.path.join(d, n)).st_mtime >= started_epoch for n in os.listdir(d))
    except OSError:
        return False


def _job_dirs(sweep_dir: str) -> list[str]:
    """The job directories Hydra made in a sweep's directory since this command started."""
    try:
        names = sorted(os.listdir(sweep_dir))
    except OSError:
        return []
    out = []
    for n in names:
        p = os.path.join(sweep_dir, n)
        try:
            made = os.lstat(p).st_mtime >= started_epoch
        except OSError:
            continue
        if not n.startswith(".") and os.path.isdir(p) and not os.path.islink(p) and (made or hydra_began(p)):
            out.append(p)
    return out


def _record(job_dir: str, started: str | None) -> None:
    """``interrupted`` in ``job_dir/status.json`` when this process's job there never
    recorded its end: no status (or one of a run before ``started``), or ``running`` with
    this process's id."""
    from ..files import read_status
    from ..run.jobstatus import mark_interrupted
    st = read_status(job_dir)
    mine = st is None or (st.get("status") == "running" and st.get("pid") == os.getpid()) \
        or (started is not None and str(st.get("started") or "") < started)
    if mine and os.path.isdir(job_dir):
        mark_interrupted(job_dir, st, "terminated (SIGTERM)" if _stopped == signal.SIGTERM else "interrupted")


def outside_main(e: BaseException) -> int:
    """The exit status of a command stopped by ``e`` outside kbframe.cli.main's own handling
    (the imports, the command's very start or end: kbframe.cli.entry), after its line."""
    interrupted(e)
    if _sweep is not None:  # a sweep's end, or its cleanup after a stop
        return finish(_sweep, None, None)
    print(f"kbframe: {'terminated (SIGTERM)' if _stopped == signal.SIGTERM else 'interrupted'}", file=sys.stderr)
    return code()

"""Work done beside the main line of a run, on the machine's second core (issue 16): the
run's speed tricks that use more than one core, in one place.

- :class:`TensorsFile`: ``tensors.npz`` of a data-mode run. The inputs and the float64
  reference are known before the simulation starts; writing them
  (``np.lib.format.write_array`` into an uncompressed zip, as ``np.savez`` does) and
  computing the reference are numpy work that releases the GIL, so a thread does both
  while the main thread simulates. The kernel's outputs are added last; the file holds
  the same arrays in the same order as ``np.savez(inputs…, references…, scalars…,
  outputs…)``. BLAS: the caller holds ``threadpool_limits(1)`` for the whole time the
  thread runs (the limit is process-wide; a second, nested limit in the thread could
  restore the other's setting out of order).
- :class:`Forked`: after a simulation, pure-Python jobs remain that need only what it
  left: the sanitizer (``run.check``), the report (critical path, metrics, trace.json),
  a fast-forwarded run's op_log. Threads would share one interpreter lock; a forked
  child inherits the engine, its records and the op_log without a copy, does one job and
  sends its result back through a pipe while the parent does another.

- :class:`Drawing`: a data-mode run's inputs are drawn in a thread (numpy's generators
  release the GIL while they fill an array, :class:`InThread`) while the main thread runs
  the pre-flight dry run, which needs no input values; a workload that hands its inputs out
  early (Workload.generate) lets the simulation start while the tensor its kernel reads
  last (decode's v) is still being drawn, its rows read as they arrive.

None is needed for a result: where no thread can be started the arrays are written
(the inputs drawn) when asked for; where ``os.fork`` does not exist or fails (a pids
limit, no memory), or the child cannot answer (killed, a result that does not pickle),
the job runs in the parent. The result is the same either way, only the time differs.
"""
from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import threading
import zipfile

import numpy as np

from ..errors import kept, restored
from ..files import release_inherited_locks
from ..sim.numerics import ArrivingRows


#: how long :meth:`TensorsFile.abandon` waits for its thread to stop
ABANDON_WAIT_S = 0.1


class Drawing:
    """``generate(rng, early)`` (a workload's Workload.generate) in a thread.
    :meth:`inputs` returns as soon as the workload hands its inputs out early, else once
    all are drawn; :meth:`result`, once all are drawn. An error of the drawing is raised by
    both, and to a reader waiting for rows that did not arrive; :meth:`stop` ends a
    drawing the run no longer needs."""

    def __init__(self, generate, rng):
        self._ready = threading.Event()
        self._early: tuple | None = None
        self._stopped = False
        self._error: BaseException | None = None
        self._thread = InThread(self._draw, generate, rng, name="inputs")

    def _draw(self, generate, rng) -> dict | None:
        try:
            return generate(rng, self._hand_out)
        except BaseException as e:  # kept, not raised on: the run's thread raises it, alone
            self._error = e
            for rows in (self._early[1] if self._early else {}).values():
                rows.fail(e)
            return None
        finally:
            self._ready.set()

    def _hand_out(self, inputs: dict, late) -> dict:
        arriving = {name: ArrivingRows(inputs[name]) for name in late}
        self._early = (inputs, arriving)
        if self._stopped:
            self.stop()
        self._ready.set()
        return arriving

    def inputs(self) -> tuple[dict, dict]:
        """``(inputs, arriving)``: name → array, and name → ArrivingRows for the arrays
        still being drawn (empty once all are)."""
        if self._thread.is_alive():
            self._ready.wait()
        if self._early is None or not self._thread.is_alive():
            return self.result(), {}
        return self._early

    def result(self) -> dict:
        """The inputs, all drawn (raises the drawing's error)."""
        inputs = self._thread.result()
        if self._error is not None:
            raise self._error
        return inputs

    def drawn(self) -> dict | None:
        """The inputs once all are drawn, or None if the drawing failed: for a thread that
        writes them (TensorsFile), so its error is raised only where the run reads the
        inputs (:meth:`result`, a stage waiting for rows), never in two threads at once."""
        self._thread.join()
        return None if self._error is not None else self.result()

    def stop(self) -> None:
        """The run ended (failed) before it needed all the rows: the drawing stops at its
        next block of rows (ArrivingRows.stop)."""
        self._stopped = True
        for rows in (self._early[1] if self._early else {}).values():
            rows.stop()


class TensorsFile:
    """Writes ``path`` (a staged temporary): the arrays ``first()`` returns (name → array:
    the inputs, once drawn; None: nothing is written) and then those ``compute()``
    returns (the references), in a thread started here; :meth:`finish` adds the ``last``
    arrays and closes the file. :meth:`abandon` (also on leaving a ``with`` block) stops
    the thread after the entry being written, which closes the file (the caller removes
    it), waiting at most :data:`ABANDON_WAIT_S` (not at all while it waits for ``first()``).

    Raises (from :meth:`results` or :meth:`finish`): whatever ``compute`` or the writing
    raised in the thread (OSError for a full disk, KeyboardInterrupt…), re-raised in the
    caller's thread.
    """

    def __init__(self, path, first, compute):
        self.path = path
        self._zip = zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self._first, self._compute = first, compute
        self._stop = False
        self._waiting = True  # for first(): the inputs still being drawn
        self._thread = InThread(self._write, name="tensors.npz")  # no thread: written by results()

    def _add(self, name: str, array) -> None:
        with self._zip.open(name + ".npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)

    def _write(self) -> dict | None:
        try:
            first = self._first()
            self._waiting = False
            if first is None:  # no inputs (their drawing failed): the run reports why
                return None
            for name, array in first.items():
                if self._stop:
                    return None
                self._add(name, array)
            computed = self._compute()
            for name, array in computed.items():
                if self._stop:
                    return None
                self._add(name, array)
            return computed
        finally:
            if self._stop:  # abandoned: the caller may have stopped waiting
                self._close()

    def results(self) -> dict:
        """What ``compute`` returned, once it and its entries are written."""
        return self._thread.result()

    def finish(self, last: dict):
        """Add ``last`` after the thread's entries, close the file and return its path."""
        self.results()
        for name, array in last.items():
            self._add(name, array)
        self._zip.close()
        return self.path

    def __enter__(self) -> "TensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        """Whatever happened: the thread is stopped and joined, the file closed."""
        self.abandon()

    def abandon(self) -> None:
        """Stop the thread after its current entry and close the file (no error raised).
        A thread still busy after :data:`ABANDON_WAIT_S` (an entry of a long context, the
        reference) is left to stop and close the file itself: Ctrl-C is not kept waiting,
        and the caller's removal of the file does not depend on it."""
        self._stop = True
        if self._waiting:  # for the inputs: it stops, and closes the file, once they come
            return
        self._thread.join(ABANDON_WAIT_S)
        if self._thread.is_alive():
            return
        self._close()

    def _close(self) -> None:
        try:
            self._zip.close()  # a second close does nothing
        except (OSError, ValueError):  # a full disk or an entry cut short: the file is dropped anyway
            pass


class Outcome:
    """``fn(*args)``'s value, or the exception it raised, kept: :meth:`result` returns the
    one or raises the other, later (in another thread, after what must come first, or
    after a forked process sent it back pickled: kbframe.errors.kept, restored)."""

    __slots__ = ("value", "error")

    def __init__(self, fn, *args):
        try:
            self.value, self.error = fn(*args), None
        except BaseException as e:  # noqa: BLE001 — raised by result()
            self.value, self.error = None, kept(e)

    def result(self):
        if self.error is not None:
            raise restored(self.error)
        return self.value


class InThread:
    """``fn(*args)`` started in a daemon thread; :meth:`result` waits for it and returns
    its value or re-raises its exception (MemoryError …) in the caller's thread. No
    thread (none can be started): the call is made by the first :meth:`result`. A caller
    that leaves without the result (an error elsewhere, Ctrl-C) is not kept waiting; the
    thread finishes on its own and its value is dropped."""

    def __init__(self, fn, *args, name: str = "kbframe-beside"):
        self._call, self._out = (fn, args), None
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        try:
            self._thread.start()
        except RuntimeError:  # can't start new thread: result() makes the call
            self._thread = None

    def _run(self) -> None:
        fn, args = self._call
        self._out = Outcome(fn, *args)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread (at most ``timeout`` s); nothing to wait for without one."""
        if self._thread is not None:
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def result(self):
        if self._thread is None:
            if self._out is None:
                self._run()
        else:
            self._thread.join()
        return self._out.result()


class Forked:
    """``fn(*args)`` started in a forked child; :meth:`result` returns what it returned or
    raises what it raised (exceptions are pickled back; a bug with the text of the
    child's traceback as a note, kbframe.errors.kept); :meth:`cancel` kills and reaps the
    child if its result was not taken. No child (no ``os.fork``, or it fails: a pids
    limit, no memory), a child that dies or a result that does not pickle: the call is
    made in the parent by :meth:`result`.

    The child holds none of the parent's run-directory locks (kbframe.files.dir_lock) and
    dies with the parent (Linux: ``PR_SET_PDEATHSIG``), so a killed run leaves no child
    behind holding its directory.
    """

    def __init__(self, fn, *args):
        self._call = (fn, args)
        self._pid = None
        if not hasattr(os, "fork"):
            return
        parent = os.getpid()
        try:
            r, w = os.pipe()
            try:
                pid = _fork()
            except BaseException:  # OSError, or Ctrl-C taken just after the fork (the child is gone)
                os.close(r)
                os.close(w)
                raise
        except OSError:  # no process or no memory to spare: the parent does the job
            return
        if pid == 0:  # the child: do the job, write its result, end without cleanup of any kind
            code = 0
            try:
                os.close(r)
                _child_setup(parent)
                try:
                    out = ("value", fn(*args))
                except BaseException as e:  # the parent re-raises it (a bug with this traceback's text)
                    out = ("error", kept(e))
                try:
                    data = pickle.dumps(out)
                except Exception:  # the parent does the job itself
                    data = b""
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        self._pid, self._f = pid, os.fdopen(r, "rb")

    def result(self):
        """The child's result (waits for it); the call made here if the child gave none."""
        if self._pid:
            with self._f:
                data = self._f.read()
            os.waitpid(self._pid, 0)
            self._pid = None
            try:
                kind, value = pickle.loads(data)
            except Exception:  # the child died, or its answer does not unpickle: ask here
                kind, value = None, None
            if kind == "error":
                raise restored(value)  # a bug says where it was, in the child (its traceback's text)
            if kind == "value":
                return value
        fn, args = self._call
        return fn(*args)

    def cancel(self) -> None:
        """Kill and reap the child if :meth:`result` has not (an error elsewhere in the run)."""
        if self._pid:
            pid, self._pid = self._pid, None
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            self._f.close()


def _fork() -> int:
    """``os.fork()`` with Ctrl-C and SIGTERM held while it runs: a signal that comes during
    the fork is taken just after it (the parent's own handler), not inside Python's
    at-fork handlers (logging's), where it would be lost with an "Exception ignored"
    message; if it raises, the child is killed and reaped first. The child starts with the
    parent's handlers."""
    if threading.current_thread() is not threading.main_thread():
        return os.fork()
    held: list = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in before.items():
        if callable(handler):  # a Python handler (SIG_DFL and SIG_IGN run none)
            signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        pid = os.fork()
    except BaseException:
        _restore(before)
        raise
    if pid == 0:  # the child starts with the parent's handlers
        _restore(before)
        return 0
    try:
        _restore(before)
        for sig in held:
            signal.raise_signal(sig)  # the handler runs here (KeyboardInterrupt …)
    except BaseException:  # the caller never learns of the child: end it here
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return pid


def _restore(handlers: dict) -> None:
    """Put back the Python signal handlers :func:`_fork` held."""
    for sig, handler in handlers.items():
        if callable(handler):
            signal.signal(sig, handler)


def _child_setup(parent: int) -> None:
    """A forked child's first steps: its own signal handling, no lock of the parent's, die
    with the parent, no cycle collection."""
    # a signal ends the child quietly (the parent records its own end, status.json);
    # one the parent ignores stays ignored
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
    release_inherited_locks()
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)
    # a short life: no cycle collection, whose walks over the parent's objects would copy
    # every page they touch
    gc.disable()

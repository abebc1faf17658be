"""Work that runs in a forked process beside the rest of the run (issue 16).

After a checked simulation two pure-Python jobs remain that need only what the
simulation left: the sanitizer (``run.check``) and the report (critical path, metrics,
trace.json). Threads would share one interpreter lock; a forked child inherits the
engine, its records and the op_log without a copy, does one job and sends its result
back through a pipe while the parent does the other on the second core. Where
``os.fork`` does not exist, or the child cannot answer (killed, a result that does not
pickle), the job runs in the parent: the result is the same either way, only the time
differs.
"""
from __future__ import annotations

import gc
import os
import pickle
import signal


class Forked:
    """``fn(*args)`` started in a forked child; :meth:`result` returns what it returned or
    raises what it raised (exceptions are pickled back), :meth:`cancel` kills and reaps
    the child if its result was not taken."""

    def __init__(self, fn, *args):
        self._call = (fn, args)
        self._pid = None
        if not hasattr(os, "fork"):
            return
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: check, write the verdict, end without cleanup of any kind
            code = 0
            try:
                os.close(r)
                # a signal ends the child quietly; the parent handles its own (status.json)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                # a short life: no cycle collection, whose walks over the parent's objects
                # would copy every page they touch
                gc.disable()
                try:
                    out = ("value", fn(*args))
                except BaseException as e:  # the parent re-raises it
                    out = ("error", e)
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
                raise value
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

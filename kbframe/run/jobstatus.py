"""``status.json`` for every run, and failure isolation for the jobs of a sweep.

Each run (a single run or one job of a ``-m`` sweep) writes ``status.json`` in its own
directory: ``running`` when it starts, then ``ok``, ``failed`` (with the error) or
``interrupted`` (Ctrl-C) before it exits, each write atomic (temporary file, rename). A
``running`` status left behind means the process died without a word (killed).

:class:`JobStatus` wraps a run. Outcomes:

=================  ==========================================  ===========================
exception          single run                                  job of a multirun
=================  ==========================================  ===========================
none               ``ok``                                      ``ok``
KbframeError       ``kbframe: error: MSG``; exit 1             same line naming the job;
                                                               the sweep goes on
other Exception    traceback (a kbframe bug); exit 1           one line; traceback saved
                                                               in status.json; goes on
KeyboardInterrupt  ``kbframe: interrupted``; exit 130           same line naming the job;
                                                               the sweep stops
SIGTERM            ``kbframe: terminated``; exit 143          same, exit 143
=================  ==========================================  ===========================

The run directory is locked for the whole run (kbframe.run.rundir): a directory another
run holds, or one where ``status.json`` cannot be written (a full disk), is refused with
one line and not touched; so is one refused before Hydra wrote into it (a symbolic link
inside it, another program's files: kbframe.cli.job_dirs), except that a sweep job whose
folder is a real kbframe one records that it failed.

The sweep's callback (:mod:`kbframe.cli.callbacks`) reads every job's status at the end,
lists the failed ones and makes the command exit non-zero.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from pathlib import Path

from . import rundir
from ..errors import KbframeError, OutputError, Terminated, raise_interrupt_behind
from ..files import STATUS_FILE, atomic_write, read_status

#: exit status of an interrupted run (128 + SIGINT) and of a terminated one (128 + SIGTERM)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


def _terminated(signum, frame):
    raise Terminated()


def now() -> str:
    """The time as status.json records it (local, ISO 8601, milliseconds)."""
    return _dt.datetime.now().astimezone().isoformat(timespec="milliseconds")


def _status_forms(status: dict):
    """``status`` as JSON: in full, then without its traceback, then without indentation
    (for a room that the full text does not fit)."""
    short = {k: v for k, v in status.items() if k != "traceback"}
    for st, indent in ((status, 2), (short, 2), (short, None)):
        yield (json.dumps(st, indent=indent, ensure_ascii=False) + "\n").encode()


def write_status(out_dir: Path, status: dict) -> None:
    """Write ``status`` to ``out_dir/status.json``: atomically (a temporary file renamed
    over it), or, when that cannot be done (a full disk), in place, into the room the
    file's blocks already take, so a run's end is recorded whatever filled the disk.

    Raises:
        OSError: neither could be done (no status.json yet on a full disk, a read-only
            directory).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / STATUS_FILE
    data = next(_status_forms(status))
    try:
        atomic_write(path, lambda tmp: tmp.write_bytes(data))
    except OSError:
        if not _write_in_place(path, status):
            raise


def _write_in_place(path: Path, status: dict) -> bool:
    """Overwrite ``path`` with ``status`` within the blocks it holds (none allocated);
    False if it does not exist, is not a regular file, or no form of the status fits."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        room = max(info.st_size, info.st_blocks * 512)
        data = next((d for d in _status_forms(status) if len(d) <= room), None)
        if data is None or not stat.S_ISREG(info.st_mode):
            return False
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def mark_killed(out_dir: Path, job: dict, why: str, status: str = "failed") -> dict:
    """Record a job whose process died without a word (SIGKILL, the OOM killer) as
    ``status`` with ``why``, unless its own ``status.json`` already says how it ended.
    Called by the launcher that saw the process die (kbframe.cli.launcher)."""
    st = read_status(out_dir)
    if st is not None and st.get("status") != "running":
        return st
    st = st or {"status": "running", **job, "started": None, "host": socket.gethostname(), "pid": None}
    st.update(status=status, finished=now(), error=why, error_type="Killed")
    try:
        write_status(Path(out_dir), st)
    except OSError as e:
        print(f"kbframe: warning: cannot write {Path(out_dir) / STATUS_FILE}: {e}", file=sys.stderr)
    return st


def mark_interrupted(out_dir, st: dict | None, why: str, status: str = "interrupted",
                     error_type: str = "KeyboardInterrupt") -> None:
    """Record ``out_dir``'s job as ``status`` (``interrupted``) with ``why``: a job Hydra
    started (its ``.hydra/`` written, or begun) that ended before it recorded itself
    (``st``: its status.json as it is, or None; kbframe.cli.stop, kbframe.cli.hydra_errors)."""
    from omegaconf import OmegaConf
    try:
        overrides = [str(o) for o in OmegaConf.load(Path(out_dir) / ".hydra" / "overrides.yaml")]
    except Exception:  # noqa: BLE001 — not written yet, or cut short
        overrides = None
    st = {"status": "running", "num": None, "overrides": overrides, "started": None, "wall_s": None,
          "host": socket.gethostname(), "pid": os.getpid()} if st is None or st.get("status") != "running" else st
    st.update(status=status, finished=now(), error=why, error_type=error_type)
    try:
        write_status(Path(out_dir), st)
    except OSError:
        pass


class JobStatus:
    """Context manager around one run: records its outcome in ``status.json`` and isolates
    failures of multirun jobs (see the module doc).

    Args:
        out_dir: the run's output directory.
        multirun: whether this run is a job of a ``-m`` sweep.
        job: ``{"num": ..., "overrides": [...]}`` recorded in the status.
    """

    def __init__(self, out_dir: Path, multirun: bool, job: dict | None = None):
        self.out_dir = Path(out_dir)
        self.multirun = multirun
        self.status = {"status": "running", **(job or {}), "started": now(), "finished": None,
                       "wall_s": None, "host": socket.gethostname(), "pid": os.getpid(),
                       "error": None, "error_type": None}
        self.ok = False
        self.sweep_dir = None
        self._t0 = 0.0

    @classmethod
    def from_hydra(cls) -> "JobStatus":
        """For the current Hydra job: its output dir, mode, job number and overrides."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf
        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        num = hc.job.get("num") if multirun else None
        # the override text as typed: an override may hold an interpolation (${oc.env:X}),
        # which is the run's to resolve (and report), not the status writer's
        overrides = [str(o) for o in OmegaConf.to_container(hc.overrides.task, resolve=False)]
        job = cls(Path(hc.runtime.output_dir), multirun, {"num": num, "overrides": overrides})
        job.sweep_dir = str(hc.sweep.dir) if multirun else None
        return job

    @property
    def label(self) -> str:
        ov = " ".join(self.status.get("overrides") or [])
        return f"job {self.status.get('num')} [{ov}]" if self.multirun else ""

    def _finish(self, status: str, exc: BaseException | None = None, tb: bool = False) -> None:
        self.status.update(status=status, finished=now(), wall_s=round(time.perf_counter() - self._t0, 3))
        if exc is not None:
            self.status["error"] = str(exc) or type(exc).__name__
            self.status["error_type"] = type(exc).__name__
        if tb:
            self.status["traceback"] = "".join(traceback.format_exception(exc))
        try:
            write_status(self.out_dir, self.status)
        except OSError as e:  # never hide the run's own outcome behind this
            print(f"kbframe: warning: cannot write {self.out_dir / STATUS_FILE}: {e}", file=sys.stderr)

    def __enter__(self) -> "JobStatus":
        """Lock the run directory and write ``running``. A directory another run holds, or
        one that cannot be written, is not touched: the refusal is raised by
        :meth:`proceed`, first thing in the ``with`` block, and reported by ``__exit__``."""
        self._t0 = time.perf_counter()
        self.refused = rundir.take_refusal(self.out_dir)  # a link or foreign files (kbframe.cli.job_dirs)
        if self.refused is not None:
            return self
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._lock = rundir.lock(self.out_dir)
            self._lock.__enter__()
        except OSError as e:
            self.refused = OutputError(f"cannot write the run directory '{self.out_dir}': {e.strerror or e}")
            return self
        except KbframeError as e:
            self.refused = e
            return self
        try:
            write_status(self.out_dir, self.status)
        except OSError as e:  # e.g. a full disk: no status, no run
            self.refused = OutputError(f"cannot write '{self.out_dir / STATUS_FILE}': {e.strerror or e}")
            self._unlock()
            return self
        if not self.multirun and threading.current_thread() is threading.main_thread():
            # a single run stopped with SIGTERM (kill, a batch system's time limit) records
            # its end like Ctrl-C, rather than leaving status.json at running
            self._sigterm = signal.signal(signal.SIGTERM, _terminated)
        return self

    def proceed(self) -> None:
        """Raise the refusal found by ``__enter__`` (call first in the ``with`` block)."""
        if self.refused is not None:
            raise self.refused

    def _unlock(self) -> None:
        lk, self._lock = getattr(self, "_lock", None), None
        if lk is not None:
            lk.__exit__(None, None, None)

    def __exit__(self, et, exc, tb) -> bool:
        try:
            return self._outcome(et, exc)
        finally:
            if getattr(self, "_sigterm", None) is not None:
                signal.signal(signal.SIGTERM, self._sigterm)
                self._sigterm = None
            self._unlock()

    def _outcome(self, et, exc) -> bool:
        where = f" ({self.label})" if self.multirun else ""
        if exc is not None and exc is self.refused:  # nothing was written: report, touch nothing
            print(f"kbframe: error{where}: {exc}", file=sys.stderr)
            if self.multirun:
                if getattr(exc, "recordable", False):  # a sweep job's own folder, reached through no link
                    self._finish("failed", exc)
                return True
            raise SystemExit(1)
        if et is None:
            self.ok = True
            self._finish("ok")
            return False
        if issubclass(et, Exception):  # an error of the unwinding from Ctrl-C or SIGTERM is that interrupt
            try:
                raise_interrupt_behind(exc)
            except KeyboardInterrupt as e:
                et, exc = type(e), e
        if issubclass(et, KeyboardInterrupt):
            self._finish("interrupted", exc)
            what = "terminated (SIGTERM)" if issubclass(et, Terminated) else "interrupted"
            # the sweep's own line (how to summarise it) is the launching process's
            # (kbframe.cli.stop), once for the sweep
            print(f"kbframe: {what}{where}; status in {self.out_dir / STATUS_FILE}", file=sys.stderr)
            raise SystemExit(EXIT_TERMINATED if issubclass(et, Terminated) else EXIT_INTERRUPTED)
        if issubclass(et, KbframeError):
            self._finish("failed", exc)
            print(f"kbframe: error{where}: {exc}", file=sys.stderr)
            if self.multirun:
                return True
            raise SystemExit(1)
        if issubclass(et, Exception):
            self._finish("failed", exc, tb=True)
            if self.multirun:
                text = "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
                print(f"kbframe: error{where}: {type(exc).__name__}: {text} "
                      f"(traceback in {self.out_dir / STATUS_FILE})", file=sys.stderr)
                return True
            return False  # a bug: Hydra prints the traceback and exits 1
        self._finish("failed", exc)  # SystemExit and the like: record, let it go
        return False

"""A run directory's life cycle: lock, stage, commit all or nothing, clean up.

One run writes ``metrics.json``, ``op_log.jsonl``, ``trace.json`` and ``tensors.npz``
(:data:`OUTPUT_FILES`) into its directory. :class:`RunDir` makes that safe against the
faults a review found:

* **two runs into one directory**: the directory is locked (``flock`` on the directory
  itself, held for the whole run, reentrant within a process) and a second run is refused
  with one line (:class:`RunDirBusy`) before it writes anything;
* **shared temporary names**: every file is staged under a unique hidden name
  (``.NAME.kbframe-tmp-PID-TOKEN``, kbframe.files.temp_path);
* **a result file that cannot be replaced** (a directory in its place, ``chattr +i``): the
  commit first moves every earlier file aside, and only when all moved does it move the new
  ones in; a failure puts back what was moved, so the directory holds one run's files,
  never a mix (:meth:`RunDir.commit`);
* **a full disk, Ctrl-C or any failure**: the run's temporaries are removed and an
  ``OSError`` becomes one :class:`~kbframe.errors.OutputError` line; a run that fails with
  a kbframe error (a deadlock, a sanitizer violation) keeps its op_log as
  ``op_log.jsonl.partial`` (and its trace as ``trace.json.partial``) for debugging, which
  the next run that passes removes;
* **stale temporaries** of a run that was killed: the next run, holding the lock, removes
  every file it recognises as a kbframe temporary (also the fixed names older kbframe
  versions used);
* **a symbolic link inside the run or sweep directory** where a run would write: refused
  (:func:`check_links`, before Hydra writes; the directory the user named may be a link);
* **another program's directory**: one holding files that no kbframe run made (no
  kbframe ``status.json``) is refused untouched (:func:`check_foreign`), so stale-file
  removal and replacement only ever touch an earlier kbframe run's files.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path

from ..errors import KbframeError, OutputError
from ..files import STATUS_FILE, TEMP_MARK, dir_lock, dir_locked, new_token, temp_path

#: files a run writes into its directory (each replaced only when the run passed)
OUTPUT_FILES = ("metrics.json", "op_log.jsonl", "tensors.npz", "trace.json")
#: what a run that failed with a kbframe error keeps for debugging: ``NAME`` -> ``NAME.partial``
DEBUG_SUFFIX = ".partial"
#: temporaries of older kbframe versions (fixed names), recognised and removed as stale
_LEGACY_TEMP = re.compile(r"^(tensors\.tmp\.npz|\.[^/]+\.\d+\.tmp|\.kbframe-write-test-\d+|.+\.partial\.tmp)$")


class RunDirBusy(OutputError):
    """Another kbframe run holds the run directory's lock."""


@contextmanager
def lock(path):
    """Hold the lock of directory ``path`` (which must exist) for the ``with`` block;
    reentrant within a process (the CLI, the status writer and the run shell all take it;
    kbframe.files.dir_lock).

    Raises:
        RunDirBusy: another process holds it.
        OutputError: the directory cannot be opened or locked.
    """
    held = dir_lock(path)
    try:
        held.__enter__()
    except BlockingIOError:
        raise RunDirBusy(f"the run directory '{path}' is in use by another kbframe run (it holds the "
                         f"directory's lock); wait for it to end or choose another hydra.run.dir") from None
    except OSError as e:
        raise OutputError(f"cannot lock the run directory '{path}': {e.strerror or e}") from None
    try:
        yield
    finally:
        held.__exit__(None, None, None)


def is_locked(path) -> bool:
    """Whether a kbframe process (this one or another) holds ``path``'s lock now."""
    return dir_locked(path)


def is_temp(name: str) -> bool:
    """Whether a file name is a kbframe temporary (this version's or an older one's)."""
    return TEMP_MARK in name or bool(_LEGACY_TEMP.match(name))


def _oserror(path, e: OSError) -> OutputError:
    name = e.filename and Path(e.filename)
    if name and TEMP_MARK in name.name:  # the file the user knows, not its hidden temporary (or a temporary's)
        name = name.with_name(name.name.split(TEMP_MARK, 1)[0].lstrip("."))
    where = f"'{name}' in the run directory" if name else f"the run directory '{path}'"
    return OutputError(f"cannot write {where}: {e.strerror or e}")


class RunDir:
    """The life cycle of one run in directory ``path`` (see the module doc)::

        with RunDir(out_dir) as rd:
            ...                                           # pre-flight: the directory is untouched
            rd.open()                                     # create, lock, check
            log = rd.temp("op_log.jsonl", debug=True)     # staged, unique name
            ...                                           # simulate, write into temps
            rd.commit({"op_log.jsonl": log, "trace.json": None, ...})  # None: remove it

    Raises:
        OutputError: the directory cannot be created or written, a result file is blocked
            by something that is not a file (both before anything is written), or an
            OSError while the run writes (a full disk ...); RunDirBusy: it is locked.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.token = new_token()
        self._debug: dict[str, Path] = {}  # NAME -> its temp, kept as NAME.partial on a kbframe error
        self._lock = None

    def __enter__(self) -> "RunDir":
        return self  # nothing is touched until open(): pre-flight errors leave no trace

    def open(self) -> "RunDir":
        """Create and lock the directory, remove stale temporaries, check every result file
        can be written. Raises OutputError / RunDirBusy."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot write the run directory '{self.path}': {e.strerror or e}") from None
        self._lock = lock(self.path)
        self._lock.__enter__()
        try:
            self.remove_stale()
            self.check()
        except BaseException:
            self._release()
            raise
        return self

    def _release(self) -> None:
        lk, self._lock = self._lock, None
        if lk is not None:
            lk.__exit__(None, None, None)

    def temp(self, name: str, debug: bool = False) -> Path:
        """A unique temporary path for result file ``name``; with ``debug`` it is kept as
        ``NAME.partial`` if the run fails with a kbframe error."""
        p = temp_path(self.path / name, self.token)
        if debug:
            self._debug[name] = p
        return p

    def remove_stale(self) -> list[str]:
        """Remove kbframe temporaries other runs left (the lock is held: none is live)."""
        gone = []
        try:
            names = os.listdir(self.path)
        except OSError:
            return gone
        for name in names:
            p = self.path / name
            if is_temp(name) and (p.is_file() or p.is_symlink()):
                try:
                    p.unlink()
                    gone.append(name)
                except OSError:
                    pass
        return gone

    def check(self) -> None:
        """Every result file can be written: nothing but a file in its place, and the
        directory accepts a new file (a probe)."""
        for name in OUTPUT_FILES:
            p = self.path / name
            if p.exists() and not p.is_file():
                raise OutputError(f"cannot write '{p}': something that is not a file is in its place")
        probe = temp_path(self.path / "write-test", self.token)
        try:
            with open(probe, "xb"):  # a new file, never through a link in its place
                pass
            probe.unlink()
        except OSError as e:
            _try(os.unlink, probe)
            raise OutputError(f"cannot write in the run directory '{self.path}': {e.strerror or e}") from None

    def commit(self, files: dict) -> None:
        """Replace the result files together: ``files`` maps a name to its staged temporary
        (or None: remove that file, the run makes none). Debug copies of a failed earlier
        run (``NAME.partial``) are removed too. Every earlier file is first moved aside; if
        one cannot be (a directory, ``chattr +i``), those moved are put back and nothing is
        replaced; then the new files move in, ``metrics.json`` last.

        Raises:
            OutputError: names the file that could not be replaced; the directory is as it
                was before the commit.
        """
        targets = list(files) + [n + DEBUG_SUFFIX for n in self._debug_names(files)]
        for name in targets:  # a directory in a result file's place: refused before anything moves
            p = self.path / name
            if p.exists() and not p.is_file() and not p.is_symlink():
                raise OutputError(f"cannot write '{p}': something that is not a file is in its place")
        with _signals_held():  # Ctrl-C or SIGTERM comes before the files move, or once all did
            self._swap(targets, files)
        self._debug.clear()

    def _swap(self, targets: list, files: dict) -> None:
        """:meth:`commit`'s moves: the earlier files aside, the new ones in, the earlier ones
        removed; undone if a move fails."""
        aside: list[tuple[Path, Path]] = []  # (target, where it was moved)
        placed: list[tuple[Path, Path]] = []  # (temp, target)
        try:
            for name in targets:
                p = self.path / name
                if os.path.lexists(p):
                    old = temp_path(p, f"{self.token}-old")
                    os.rename(p, old)
                    aside.append((p, old))
            order = sorted((n for n, t in files.items() if t is not None), key=lambda n: n == "metrics.json")
            for name in order:
                os.rename(files[name], self.path / name)
                placed.append((files[name], self.path / name))
        except BaseException as e:
            for tmp, p in reversed(placed):  # undo: the new files back to their temporaries,
                _try(os.rename, p, tmp)
            for p, old in reversed(aside):   # the earlier files back in place
                _try(os.rename, old, p)
            if isinstance(e, OSError):
                raise OutputError(f"cannot replace '{e.filename}' (the run's files were left as they were): "
                                  f"{e.strerror or e}") from None
            raise
        for _, old in aside:
            _try(os.unlink, old)

    def _debug_names(self, files: dict) -> list[str]:
        return [n for n in files if n in ("op_log.jsonl", "trace.json")]

    def __exit__(self, et, exc, tb) -> bool:
        if self._lock is None:  # never opened (or released): nothing of this run is on disk
            return False
        try:
            if et is not None:
                self._cleanup(keep_debug=issubclass(et, KbframeError) and not issubclass(et, OutputError))
        finally:
            self._release()
        if et is not None and issubclass(et, OSError):
            raise _oserror(self.path, exc) from None
        return False

    def _cleanup(self, keep_debug: bool) -> None:
        """After a failure: keep the debug copies (or not), remove every other temporary
        of this run (also ones a writer derived from a temp name, e.g. ``...TOKEN.tmp``)."""
        if keep_debug:
            for name, tmp in self._debug.items():
                if tmp.is_file():
                    _try(os.replace, tmp, self.path / (name + DEBUG_SUFFIX))
        mark = f"{TEMP_MARK}{self.token}"
        try:
            names = os.listdir(self.path)
        except OSError:
            return
        for name in names:
            if mark in name and "-old" not in name.split(mark, 1)[1]:
                _try(os.unlink, self.path / name)


@contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM held back while the block runs, then handled as they would have
    been (the handlers in place before, kbframe.cli.stop's or a run's), once it is done.
    Only the main thread handles signals; elsewhere (a launcher's worker thread) nothing
    is held."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list = []

    def note(signum, frame):
        came.append((signum, frame))
    before = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():  # None: one not set from Python, the default's
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if came:
            signum, frame = came[0]
            handler = before[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def _try(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass


# ---------------------------------------------------------------- whose directory is it

#: what Hydra writes in a run's ``hydra.output_subdir`` (``.hydra/``)
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
#: what a sweep writes at its root (Hydra's sweeper, kbframe's report, Optuna's sweeper)
SWEEP_FILES = ("multirun.yaml", "sweep.csv", "summary.md", "sweep.png", "pareto.png", "optimization_results.yaml")
#: the outcomes a kbframe ``status.json`` records (kbframe.run.jobstatus)
_STATUSES = ("running", "ok", "failed", "interrupted")


class LinkRefused(OutputError):
    """A folder or file a run would write inside its run or sweep directory is a symbolic
    link (kbframe never makes one)."""

    def __init__(self, path):
        super().__init__(f"'{path}' is a symbolic link: kbframe writes nothing through a link inside a run or sweep "
                         f"directory (only the directory hydra.run.dir or hydra.sweep.dir names may be one); remove "
                         f"the link or choose another directory")
        self.path = str(path)


def check_links(root, out_dir, output_subdir=".hydra") -> None:
    """Refuse a run into ``out_dir`` (``root`` is the directory the user named: the run's
    own, or the sweep's) that would write through a symbolic link: a folder of ``out_dir``
    below ``root`` (a sweep's job folder), ``output_subdir`` (Hydra's ``.hydra/``) and
    the files Hydra and kbframe write there. ``root`` itself (and what is above it) may be
    a link the user made (``outputs -> /big/disk``).

    Raises:
        LinkRefused: names the first link.
    """
    root, out = Path(root), Path(out_dir)
    try:
        parts = out.relative_to(root).parts
    except ValueError:
        parts = ()
    p = root
    for part in parts:
        p = p / part
        if p.is_symlink():
            raise LinkRefused(p)
        if not p.exists():
            return  # nothing below exists: nothing to follow
    names = [output_subdir, *(f"{output_subdir}/{n}" for n in HYDRA_FILES)] if output_subdir else []
    names += [STATUS_FILE, *OUTPUT_FILES, *(n + DEBUG_SUFFIX for n in ("op_log.jsonl", "trace.json"))]
    for n in names:
        if (out / n).is_symlink():
            raise LinkRefused(out / n)


def check_sweep_links(sweep_dir) -> None:
    """Refuse a sweep whose root holds a link where it writes a file (``multirun.yaml``,
    the report's files). Raises LinkRefused."""
    for n in SWEEP_FILES:
        if (Path(sweep_dir) / n).is_symlink():
            raise LinkRefused(Path(sweep_dir) / n)


def is_kbframe_status(st) -> bool:
    """Whether ``st`` (a parsed status.json) is one kbframe wrote: the mark of a kbframe run
    directory (kbframe.run.jobstatus)."""
    return isinstance(st, dict) and st.get("status") in _STATUSES and "started" in st


def foreign_entries(path, sweep: bool = False, skip_links: bool | None = None) -> list[str]:
    """What directory ``path`` holds that no kbframe run or sweep made, as paths relative to
    it (sorted); empty for a missing or empty directory and for a kbframe run directory
    (its ``status.json`` is kbframe's: every result file there is a kbframe run's).

    Without a kbframe ``status.json`` only Hydra's ``.hydra/`` and kbframe temporaries are
    a run's. A sweep directory (``sweep=True``) may hold, besides, the sweep's own files
    (:data:`SWEEP_FILES`, ``.submitit/``) and job folders, each of which is judged as a
    run directory (nested folders of a ``hydra.sweep.subdir`` too); a link in a sweep is
    left to the job that would write through it (:func:`check_links`), and so is one in a
    run directory with ``skip_links=True``."""
    return _foreign(Path(path), top_sweep=sweep, in_sweep=sweep if skip_links is None else skip_links, prefix="")


def _foreign(path: Path, top_sweep: bool, in_sweep: bool, prefix: str) -> list[str]:
    from ..files import read_status
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return []
    if not top_sweep and is_kbframe_status(read_status(path)):
        return []
    out = []
    for e in entries:
        if is_temp(e.name):
            continue
        if e.is_symlink():
            if not in_sweep:
                out.append(prefix + e.name)
            continue
        if e.is_dir(follow_symlinks=False):
            if e.name == (".submitit" if top_sweep else ".hydra"):
                continue
            if in_sweep:
                out += _foreign(Path(e.path), False, True, prefix + e.name + "/")
                continue
        elif top_sweep and e.name in SWEEP_FILES:
            continue
        out.append(prefix + e.name)
    return out


def check_foreign(path, sweep: bool = False, key: str = "hydra.run.dir") -> None:
    """Refuse to run in a directory that holds what is not kbframe's (:func:`foreign_entries`):
    kbframe would replace or remove a user's ``metrics.json``, ``trace.json`` ...

    Raises:
        OutputError: names the directory and what in it is not kbframe's.
    """
    found = foreign_entries(path, sweep)
    if not found:
        return
    kind = "sweep" if sweep else "run"
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    raise OutputError(f"the {kind} directory '{path}' holds files that are not a kbframe {kind}'s ({shown}): kbframe "
                      f"runs only in a new or empty directory or one an earlier kbframe {kind} made, and never "
                      f"replaces or removes another program's files; choose another {key}")


_REFUSED: dict = {}  # run directory -> the refusal its job function is to report (kbframe.cli.job_dirs)


def refuse(path, err: OutputError) -> None:
    """Have the run into ``path`` refused with ``err`` (taken by kbframe.run.jobstatus)."""
    _REFUSED[os.path.abspath(path)] = err


def take_refusal(path) -> OutputError | None:
    """The refusal :func:`refuse` set for ``path`` (once), else None."""
    return _REFUSED.pop(os.path.abspath(path), None)

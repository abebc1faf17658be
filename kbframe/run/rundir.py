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
  versions used).
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path

from ..errors import KbframeError, OutputError
from ..files import TEMP_MARK, dir_lock, dir_locked, new_token, temp_path

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
    where = f"'{e.filename}' in the run directory" if e.filename else f"the run directory '{path}'"
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
            probe.write_bytes(b"")
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
        self._debug.clear()

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


def _try(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass

"""Writing result files so that nothing is ever half-written: write a temporary file beside
the target, then rename it over the target (atomic on POSIX). A Ctrl-C or a full disk
leaves the previous file, or none. Reading a run's small files (:func:`read_small`) only
from regular files of bounded size: a FIFO or a device in a job directory is not read."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

#: marks kbframe's temporary files: ``.NAME.kbframe-tmp-PID-TOKEN``, unique per writer, so
#: two writers never share one and a later run recognises a stale one (kbframe.run.rundir)
TEMP_MARK = ".kbframe-tmp-"


def new_token() -> str:
    """A writer's token for temporary names: the process id and 8 random hex digits."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def temp_path(path: Path, token: str | None = None) -> Path:
    """A unique temporary name beside ``path`` (hidden, carrying :data:`TEMP_MARK`)."""
    path = Path(path)
    return path.with_name(f".{path.name}{TEMP_MARK}{token or new_token()}")


_held: dict[str, list] = {}  # real path -> [fd, depth]: directory locks this process holds


@contextmanager
def dir_lock(path):
    """Hold an exclusive lock on directory ``path`` (``flock`` on the directory itself, so
    nothing is left behind; released when the process ends, however it ends) for the
    ``with`` block; reentrant within a process. kbframe.run.rundir locks run and sweep
    directories with it.

    Raises:
        BlockingIOError: another process holds it.
        OSError: it cannot be opened.
    """
    key = os.path.realpath(path)
    held = _held.get(key)
    if held is not None:
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
        return
    fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise BlockingIOError(e.errno, "locked by another process", key) from None
        raise
    _held[key] = entry = [fd, 1]
    try:
        yield
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            del _held[key]
            os.close(fd)  # releases the flock


def dir_locked(path) -> bool:
    """Whether a process (this one or another) holds ``path``'s :func:`dir_lock` now;
    False also when it cannot be opened."""
    if os.path.realpath(path) in _held:
        return True
    try:
        with dir_lock(path):
            return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def final_name(name: str) -> str:
    """The file name a temporary name (:func:`temp_path`) stands for; other names as given."""
    return name[1:].split(TEMP_MARK, 1)[0] if TEMP_MARK in name and name.startswith(".") else name


def atomic_write(path: Path, write) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file to ``path``.

    Raises:
        whatever ``write`` or the rename raises (OSError ...; one that names no file, as a
        full disk's, or the temporary file then names ``path``); the temporary file is removed.
    """
    tmp = temp_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        if e.filename is None or str(e.filename) == str(tmp):  # a full disk's names none, or the temporary
            e.filename = str(path)
        raise
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
    atomic_write(path, write)


#: a run directory's status file (kbframe.run.jobstatus writes it, the sweep report reads it)
STATUS_FILE = "status.json"


#: the most bytes :func:`read_small` reads (a decoder layer's metrics.json is ~64 KB)
SMALL_FILE_LIMIT = 64 << 20


def read_small(path, limit: int = SMALL_FILE_LIMIT) -> str:
    """The text of ``path`` if it is a regular file of at most ``limit`` bytes.

    Opened without blocking (a FIFO never hangs the reader) and checked on the open file
    (a link to ``/dev/zero`` or a directory is refused, not read).

    Raises:
        OSError: it cannot be opened, is not a regular file, or is larger than ``limit``.
        ValueError: it is not UTF-8 text."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data.decode("utf-8")


def read_status(job_dir: Path) -> dict | None:
    """The job's status dict, or None if it has none (or it cannot be parsed)."""
    try:
        st = json.loads(read_small(Path(job_dir) / STATUS_FILE, 1 << 20))
        return st if isinstance(st, dict) else None
    except (OSError, ValueError):
        return None


def stdout_gone() -> int:
    """The reader of standard output went away (``... | head``): standard output is sent to
    /dev/null, so that Python's flush at exit does not fail again, and the exit status of a
    tool killed by SIGPIPE (128 + 13) is returned, for the command to exit with quietly."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141

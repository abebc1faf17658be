"""Writing result files so that nothing is ever half-written: write a temporary file beside
the target, then rename it over the target (atomic on POSIX). A Ctrl-C or a full disk
leaves the previous file, or none."""
from __future__ import annotations

import json
import os
import secrets
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


def final_name(name: str) -> str:
    """The file name a temporary name (:func:`temp_path`) stands for; other names as given."""
    return name[1:].split(TEMP_MARK, 1)[0] if TEMP_MARK in name and name.startswith(".") else name


def atomic_write(path: Path, write) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file to ``path``.

    Raises:
        whatever ``write`` or the rename raises (OSError ...); the temporary file is removed.
    """
    tmp = temp_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
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


def read_status(job_dir: Path) -> dict | None:
    """The job's status dict, or None if it has none (or it cannot be parsed)."""
    try:
        with open(Path(job_dir) / STATUS_FILE) as f:
            st = json.load(f)
        return st if isinstance(st, dict) else None
    except (OSError, ValueError):
        return None

"""Writing result files so that nothing is ever half-written: write a temporary file beside
the target, then rename it over the target (atomic on POSIX). A Ctrl-C or a full disk
leaves the previous file, or none."""
from __future__ import annotations

import json
import os
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file to ``path``.

    Raises:
        whatever ``write`` or the rename raises (OSError ...); the temporary file is removed.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
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

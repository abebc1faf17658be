"""One clear line for the mistakes Hydra reports before kbframe's code runs (issue 4).

Two cheap measures, both inert for a correct command line and for ``-m`` sweeps:

* :func:`precheck` looks at the command line before Hydra does: a config group choice
  (``+bench=NAME``, ``hardware=NAME``, ``calibration=NAME``, also comma lists of a sweep)
  that names no file in ``conf/<group>/`` is reported with the available names, and a
  ``hydra.run.dir`` / ``hydra.sweep.dir`` that cannot be created or written is reported
  before Hydra tries to. It stays silent when the config search path is extended
  (``hydra.searchpath``, ``--config-dir``) or a value uses sweep syntax.
* :func:`run` holds back what is written to stderr until kbframe's task function starts
  (:func:`release`). If Hydra exits before that (a composition error: a wrong type, an
  unknown key, a missing file), its multi-line message is folded into one
  ``kbframe: error: ...`` line, and so is a traceback ending in a YAML syntax error of a
  config or recipe file; any other traceback (a bug) is passed through untouched.
  ``HYDRA_FULL_ERROR=1`` still shows Hydra's full stack trace.
"""
from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

GROUPS = ("bench", "hardware", "calibration", "model")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_CONF = Path(__file__).resolve().parents[1] / "conf"


def available(group: str) -> list[str]:
    """Names of the configs in ``conf/<group>/``."""
    return sorted(p.stem for p in (_CONF / group).glob("*.yaml"))


def _writable_dir(path: str) -> str | None:
    """None if ``path`` can be created and written, else the reason."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".kbframe-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        return e.strerror or str(e)
    return None


def precheck(argv: list[str]) -> str | None:
    """The one-line message for a command line Hydra would reject, or None."""
    if any(a in ("-cd", "--config-dir", "-cp", "--config-path") or a.startswith(("--config-dir=", "--config-path="))
           or a.lstrip("+").startswith("hydra.searchpath") for a in argv):
        return None
    multirun = any(a in ("-m", "--multirun") for a in argv)
    for a in argv:
        if a.startswith("-") or "=" not in a:
            continue
        key, _, val = a.partition("=")
        if key.startswith("~"):
            continue
        key = key.lstrip("+")
        if key in GROUPS:
            names = available(key)
            choices = [v.strip() for v in val.split(",")]
            if not names or not all(_NAME.fullmatch(v) for v in choices):
                continue  # sweep syntax (choice(...), glob(...)): Hydra's business
            for v in choices:
                if v not in names:
                    return f"unknown {key} '{v}' (available: {', '.join(names)})"
        elif key == ("hydra.sweep.dir" if multirun else "hydra.run.dir") and "${" not in val:
            why = _writable_dir(val)
            if why is not None:
                return f"cannot write the run directory '{val}' ({key}): {why}"
    return None


def one_line(text: str) -> str:
    """Fold Hydra's multi-line error text into one line (key first, options listed)."""
    lines = [ln.strip() for ln in text.splitlines()]
    key, options, parts, in_options = None, [], [], False
    for ln in lines:
        if ln.startswith(("Config search path", "Set the environment variable HYDRA_FULL_ERROR")):
            break
        if not ln:
            in_options = False
            continue
        if ln.startswith("full_key:"):
            key = ln.split(":", 1)[1].strip()
        elif ln.startswith("object_type="):
            continue
        elif ln.startswith("Available options in"):
            in_options = True
        elif in_options:
            options.append(ln)
        else:
            parts.append(ln.removeprefix("In 'config': ").rstrip("."))
    msg = "; ".join(parts) or text.strip().replace("\n", " ")
    if key and key not in msg.split(":")[0]:
        msg = f"{key}: {msg}"
    if options:
        msg += f" (available: {', '.join(options)})"
    return msg


_YAML_EXC = re.compile(r"^(yaml(?:\.\w+)*\.\w*Error): (.*)$")


def yaml_error(text: str) -> str | None:
    """One line for a traceback that ends in a YAML syntax error of a config or recipe
    file (a user error, not a bug); None for any other traceback."""
    lines = text.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _YAML_EXC.match(lines[i])
        if m:
            rest = " ".join(ln.strip() for ln in [m.group(2), *lines[i + 1:]] if ln.strip())
            return f"YAML syntax error ({m.group(1).rsplit('.', 1)[-1]}): {rest}"
        if lines[i].startswith("  File "):
            return None
    return None


class _Tap(io.TextIOBase):
    """stderr stand-in that buffers until released, then passes writes through."""

    def __init__(self, real):
        self.real = real
        self.buf: list[str] = []
        self.released = False

    def write(self, s):
        if self.released:
            return self.real.write(s)
        self.buf.append(s)
        return len(s)

    def flush(self):
        if self.released:
            self.real.flush()

    def isatty(self):
        return self.real.isatty()

    def fileno(self):
        return self.real.fileno()

    @property
    def encoding(self):
        return getattr(self.real, "encoding", "utf-8")

    def take(self) -> str:
        text, self.buf = "".join(self.buf), []
        self.released = True
        return text


_tap: _Tap | None = None


def release() -> None:
    """Called first thing in kbframe's task function: stderr is stderr again."""
    global _tap
    tap, _tap = _tap, None
    if tap is not None and not tap.released:
        if sys.stderr is tap:
            sys.stderr = tap.real
        text = tap.take()
        if text:
            tap.real.write(text)


def run(hydra_main) -> None:
    """Run the Hydra-decorated ``hydra_main()`` with the measures above."""
    global _tap
    msg = precheck(sys.argv[1:])
    if msg is not None:
        print(f"kbframe: error: {msg}", file=sys.stderr)
        sys.exit(1)
    real = sys.stderr
    _tap = tap = _Tap(real)
    sys.stderr = tap
    try:
        hydra_main()
    except SystemExit as e:
        if not tap.released:
            sys.stderr = real
            text = tap.take()
            failed = e.code not in (0, None) and text.strip()
            if failed and "Traceback (most recent call last)" not in text:
                print(f"kbframe: error: {one_line(text)}", file=real)
            elif failed and yaml_error(text):
                print(f"kbframe: error: {yaml_error(text)}", file=real)
            else:
                real.write(text)
        raise
    finally:
        if not tap.released:
            sys.stderr = real
            real.write(tap.take())
        _tap = None

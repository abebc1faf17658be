"""One clear line for the mistakes Hydra reports before kbframe's code runs.

Three cheap measures, all inert for a correct command line and for ``-m`` sweeps:

* the command line is checked before Hydra sees it (:func:`kbframe.cli.checks.precheck`);
* a single run into a named ``hydra.run.dir`` holds the directory's lock from before Hydra
  writes there (kbframe.run.rundir), so a second run into it is refused untouched.
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

from ..params import problem
from ..run import rundir
from ..run.schema import declaration
from ..run.rundir import RunDirBusy
from . import stop
from .checks import precheck, run_dir_arg


_CHOICE = re.compile(r"^(?:Error merging override (?P<key>[\w.]+)=.*?; |(?P<path>[\w.]+): )?"
                     r"Invalid value '(?P<value>.*)', expected one of \[.*\]$")


def choice_error(msg: str) -> str:
    """OmegaConf's refusal of a value for a choice (an Enum-typed schema field) as the key's
    declared message (kbframe.params: ``hardware.hbm_mode must be partitioned or shared, got
    'x'``); any other message as it is."""
    m = _CHOICE.match(msg)
    key = m and (m["key"] or m["path"])
    spec = declaration(key) if key else None
    if spec is None or spec.choices is None:
        return msg
    return f"{key} {problem(spec.choices, spec, m['value'], typed=True)}".replace("the key=", f"{key}=")


_GROUP_KEY = re.compile(r"^(?P<key>bench\.(?P<field>\w+)): In '(?P<group>\w+)/(?P<name>[\w.-]+)': ConfigKeyError "
                        r"raised while composing config:; Key '(?P=field)' not in '(?P<cls>\w+)'$")


def group_key_error(msg: str) -> str:
    """A preset of a config group that sets a bench key the chosen bench does not have
    (``+bench=decode_opt2 +model=llama3_8b``): which benches take it; any other message
    as it is."""
    m = _GROUP_KEY.match(msg)
    if m is None:
        return msg
    from .help import benches_with  # the error's path only: it imports every workload
    takes = benches_with(m["field"])
    goes = (f"the {m['group']} presets go with " + " or ".join(f"+bench={b}" for b in takes) if takes else
            f"no bench has {m['key']}")
    named = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith(("+bench=", "bench=", "++bench="))]
    bench = f"+bench={named[-1]}" if named and "," not in named[-1] else f"this bench ({m['cls']})"
    return f"{m['key']}: +{m['group']}={m['name']} sets it, and {bench} has no such key; {goes}"


_NO_KEY = re.compile(r"^Could not override '(?P<key>[^']+)'; To append to your config use \+[^;]*; "
                     r"Key '(?P<name>[^']+)' not in '(?P<cls>\w+)'$")


def unknown_key_error(msg: str) -> str:
    """Hydra's refusal of an override of a key a structured config does not declare,
    without its advice to append it with ``+`` (which the schema refuses too): the key, the
    config and where the keys are listed; any other message as it is."""
    m = _NO_KEY.match(msg)
    if m is None:
        return msg
    listed = m["key"].split(".", 1)[0] in ("run", "calibration", "hardware", "bench")  # --help's sections
    return (f"Could not override '{m['key']}': {m['cls']} has no key '{m['name']}'"
            + (" (python -m kbframe --help lists the keys)" if listed else ""))


_TWICE = re.compile(r"^Multiple values for (?P<group>[\w/.]+)\. To override a value use 'override [^']*'$")


def group_twice_error(msg: str) -> str:
    """Hydra's refusal of a config group chosen twice, whose advice (a defaults-list
    ``override``) cannot be typed on the command line: which group, and what to give; any
    other message as it is."""
    m = _TWICE.match(msg)
    if m is None:
        return msg
    g = m["group"]
    return f"{g} is chosen twice (+{g}=… given more than once): give one +{g}=NAME"


def one_line(text: str) -> str:
    """Fold Hydra's multi-line error text into one line (key first, options listed; a
    refused choice as its declared message, :func:`choice_error`)."""
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
    return group_twice_error(unknown_key_error(group_key_error(choice_error(msg))))


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


_OC_EXC = re.compile(r"^omegaconf\.errors\.(\w+): (.*)$")


def omegaconf_error(text: str) -> str | None:
    """One line for a traceback that ends in an OmegaConf error Hydra raised resolving its
    own keys (``hydra.run.dir=${oc.env:NOPE}``: a user error, not a bug); None for any
    other traceback."""
    lines = text.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _OC_EXC.match(lines[i])
        if m:
            rest = [ln.strip() for ln in lines[i + 1:] if ln.strip()]
            key = next((ln.split(":", 1)[1].strip() for ln in rest if ln.startswith("full_key:")), None)
            if key is None or not key.startswith("hydra."):
                return None
            return f"{key}: cannot resolve: {m.group(2)}"
        if lines[i].startswith("  File "):
            return None
    return None


_OS_EXC = re.compile(r"^(?:\w+\.)*(\w*Error): \[Errno \d+\] (.*)$")


def save_error(text: str, where: str = "_save_config") -> str | None:
    """The reason, for a traceback of Hydra failing to write a run's ``.hydra/`` (a full
    disk, a read-only directory; ``where``: a line of the traceback that says so, or
    ``multirun.yaml`` for a sweep's record of itself); None for any other traceback."""
    lines = text.rstrip().splitlines()
    if not any(where in ln for ln in lines):
        return None
    for ln in reversed(lines):
        m = _OS_EXC.match(ln.strip())
        if m:
            return m.group(2)
        if ln.startswith("  File "):
            return None
    return None


def _record_save_error(why: str) -> None:
    """A single run into a named directory whose ``.hydra/`` Hydra began to rewrite:
    status.json says this run failed (in place if need be), not an earlier run's end; a
    file of ``.hydra/`` that Hydra left empty (a full disk) is removed."""
    key, val = run_dir_arg(sys.argv[1:])
    if key == "hydra.run.dir" and val and "${" not in val and stop.hydra_began(val):
        from ..run.jobstatus import mark_interrupted
        mark_interrupted(val, None, why, status="failed", error_type="OutputError")
        for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
            path = os.path.join(val, ".hydra", name)
            try:
                if not os.path.islink(path) and os.path.isfile(path) and os.path.getsize(path) == 0:
                    os.unlink(path)
            except OSError:
                pass


def _sweep_save_error(reason: str) -> str:
    """A sweep whose ``multirun.yaml`` Hydra could not write (before any job ran): the line
    to print; the file it left cut short is removed (Hydra had truncated it to write it)."""
    _, val = run_dir_arg(sys.argv[1:])
    where = "the sweep's multirun.yaml"
    if val and "${" not in val:
        path = os.path.join(val, "multirun.yaml")
        where = f"'{path}'"
        try:
            if os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
        except OSError:
            pass
    return (f"cannot write {where} (Hydra's record of the sweep, before any job runs): {reason}; "
            f"free space or choose another hydra.sweep.dir")


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
    msg = precheck(sys.argv[1:])
    if msg is not None:
        print(f"kbframe: error: {msg}", file=sys.stderr)
        sys.exit(1)
    key, val = run_dir_arg(sys.argv[1:])
    if key == "hydra.run.dir" and val and "${" not in val \
            and not any(a.lstrip("+").startswith("sweep=") for a in sys.argv[1:]):
        # a single run into a named directory: lock it before Hydra writes .hydra/ there, so
        # a second run into it is refused before touching anything (kbframe.run.rundir)
        try:
            with rundir.lock(val):
                _run(hydra_main)
        except RunDirBusy as e:
            print(f"kbframe: error: {e}", file=sys.stderr)
            sys.exit(1)
    else:
        _run(hydra_main)


def _run(hydra_main) -> None:
    global _tap
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
            if stop.stopped():  # what unwinding from Ctrl-C raised is not an error of the user's
                stop.to(real)
                real.write(text)
            elif failed and "Traceback (most recent call last)" not in text:
                print(f"kbframe: error: {one_line(text)}", file=real)
            elif failed and yaml_error(text):
                print(f"kbframe: error: {yaml_error(text)}", file=real)
            elif failed and omegaconf_error(text):
                print(f"kbframe: error: {omegaconf_error(text)}", file=real)
            elif failed and save_error(text):
                why = f"cannot write the run's .hydra/ (Hydra's copy of its config): {save_error(text)}"
                _record_save_error(why)
                print(f"kbframe: error: {why}", file=real)
            elif failed and (reason := save_error(text, "multirun.yaml")):
                print(f"kbframe: error: {_sweep_save_error(reason)}", file=real)
            else:
                real.write(text)
        raise
    except Exception as e:  # noqa: BLE001
        # Hydra re-raises an error it failed to format (an unresolvable hydra.run.dir in a
        # single run): one line if it is an OmegaConf error of one of Hydra's own keys
        key = str(getattr(e, "full_key", "") or "")
        if tap.released or not key.startswith("hydra.") or type(e).__module__ != "omegaconf.errors":
            raise
        sys.stderr = real
        tap.take()
        why = str(getattr(e, "msg", "") or e).splitlines()[0]
        print(f"kbframe: error: {key}: cannot resolve: {why}", file=real)
        raise SystemExit(1) from None
    finally:
        if not tap.released:
            sys.stderr = real
            real.write(tap.take())
            stop.to(real)
        _tap = None

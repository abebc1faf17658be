"""What kbframe checks before a run, where Hydra would check it late or not at all.

* :func:`precheck`, on the command line before Hydra sees it: a config group choice
  (``+bench=NAME``, ``hardware=NAME``, ``calibration=NAME``, ``+search=NAME``, also comma
  lists of a sweep) that names no file in ``conf/<group>/`` is reported with the available
  names; a ``hydra.run.dir`` / ``hydra.sweep.dir`` that cannot be created or written is
  reported before Hydra tries to (one holding ``${...}``, the default too, by its existing
  part; an empty one is refused; ``hydra.sweep.subdir`` / ``hydra.output_subdir``, wherever
  set, are checked on the composed config by :mod:`kbframe.cli.hydra_guard`); recipe names and files are checked (:func:`check_recipes`); Hydra keys that
  would build objects (a ``_target_``, a logging handler, an Optuna storage or custom search
  space) are refused; ``+search=`` needs the Optuna sweeper. Group choices are not checked
  when the config search path is extended (``hydra.searchpath``, ``--config-dir``) or a
  value uses sweep syntax.
* :func:`check_composed_recipes` and :func:`check_config`, on the composed config before the
  bench runs.

Each returns or raises one line; :mod:`kbframe.cli.hydra_errors` prints it.
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from ..errors import ConfigError, KbframeError, RecipeError
from ..tl import recipe as recipe_files
from ..yaml_values import check_resolves


GROUPS = ("bench", "hardware", "calibration", "energy", "model", "search")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_CONF = Path(__file__).resolve().parents[1] / "conf"


def available(group: str) -> list[str]:
    """Names of the configs in ``conf/<group>/``."""
    return sorted(p.stem for p in (_CONF / group).glob("*.yaml"))


#: the folders :func:`_writable_dir` made for a single run, deepest first
_made_for_run: list[Path] = []


def _writable_dir(path: str, keep: bool = True) -> str | None:
    """None if ``path`` can be created and written, else the reason. It is made (a single
    run locks it before Hydra writes there; :func:`remove_unused_run_dir` removes it again
    if the command ends before anything was written in it); with ``keep=False`` (a sweep's,
    which the sweep makes when it locks it) the folders made to find out are removed again,
    so a sweep refused later (a search's objectives) leaves no empty directory."""
    p = Path(path)
    # a path through '..' names its folders only as the file system resolves it: none is
    # taken for one this command made (removing it could remove the user's)
    made = _made_for_run if keep and ".." not in p.parts else []
    _made_for_run.clear()
    try:
        for q in (p, *p.parents):
            if q.exists() or q.is_symlink():  # raise for a name the file system refuses (too long)
                if not q.is_dir():
                    return f"'{q}' is not a directory"
                break
            made.append(q)
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".kbframe-write-test-{os.getpid()}"
        with open(probe, "xb"):  # a new file, never through a link in its place
            pass
        probe.unlink()
    except OSError as e:
        return e.strerror or str(e)
    finally:
        for q in [] if keep else made:  # deepest first
            try:
                q.rmdir()
            except OSError:
                break
    return None


def remove_unused_run_dir() -> None:
    """Remove the folders made for this command's single run that are still empty (a run
    refused while Hydra composed its config wrote nothing there)."""
    for q in _made_for_run:  # deepest first; a folder with anything in it stays, and so do its parents
        try:
            q.rmdir()
        except OSError:
            break
    _made_for_run.clear()


_SWEEP_FUNCS = {"choice", "range", "interval", "glob", "sort", "shuffle", "tag"}
_RECIPES_KEYS = ("recipes", "+recipes", "++recipes")


def _search_dirs(argv: list[str]) -> list[Path]:
    """Folders of the config search path this command line gives Hydra: the primary config
    folder, ``--config-dir`` and ``hydra.searchpath`` (else conf/config.yaml's)."""
    dirs, entries = [_CONF], None
    for i, a in enumerate(argv):
        if a in ("-cd", "--config-dir") and i + 1 < len(argv):
            dirs.append(Path(argv[i + 1]))
        elif a.startswith("--config-dir="):
            dirs.append(Path(a.split("=", 1)[1]))
        elif a.lstrip("+").startswith("hydra.searchpath="):
            entries = re.findall(r"[^\[\],\s'\"]+", a.split("=", 1)[1])
    if entries is None:
        entries = ["pkg://kbframe"]
    for e in entries:
        if e.startswith("file://"):
            dirs.append(Path(e[len("file://"):]))
        elif e.startswith("pkg://"):
            try:
                spec = importlib.util.find_spec(e[len("pkg://"):])
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.submodule_search_locations:
                dirs += [Path(p) for p in spec.submodule_search_locations]
        else:
            dirs.append(Path(e))
    return dirs


def _default_recipes() -> list[str]:
    """The recipe names conf/config.yaml's defaults list loads."""
    from omegaconf import OmegaConf
    for item in OmegaConf.load(_CONF / "config.yaml").get("defaults", []):
        if OmegaConf.is_dict(item) and "recipes" in item:
            return [str(n) for n in (item.recipes or [])]
    return []


def check_recipes(argv: list[str]) -> None:
    """Before Hydra reads any recipe file: every recipe name on the command line is a plain
    name, and every file on the search path that a loaded recipe name resolves to is headed
    ``# @package recipes.NAME`` (kbframe.tl.recipe.check_name / check_file).

    Raises:
        RecipeError: the first name or file that breaks this.
    """
    names = None
    for a in argv:
        key, eq, val = a.partition("=")
        if key.lstrip("+~").startswith("recipes@"):
            raise RecipeError(f"{key.lstrip('+~')}: a recipe is loaded into recipes.NAME only; a package override "
                              f"(recipes@...) is not taken")
        if eq and key in _RECIPES_KEYS:
            if re.search(r"[/\\]|\.\.", val):
                bad = next(t for t in re.findall(r"[^\[\],()\s]+", val) if re.search(r"[/\\]|\.\.", t))
                recipe_files.check_name(bad, "recipes")
            names = [t for t in re.findall(r"[^\[\],()\s]+", val) if t not in _SWEEP_FUNCS]
            for n in names:
                recipe_files.check_name(n, "recipes")
    for name in (names if names is not None else _default_recipes()):
        for d in _search_dirs(argv):
            f = d / "recipes" / f"{name}.yaml"
            if f.is_file():
                recipe_files.check_file(name, f)


_OWN_SOURCES = {("pkg", "hydra.conf"), ("pkg", "kbframe.conf"), ("pkg", "kbframe"), ("structured", "")}


def check_composed_recipes() -> None:
    """After composition, in the task function: every recipe Hydra's defaults list loaded
    (from the command line or any config's defaults) is ``recipes/NAME`` with a plain name
    and package ``recipes.NAME``. Only when the search path holds folders other than
    kbframe's own (a user's recipes or configs); kbframe's are checked by the tests.

    Raises:
        RecipeError: names the recipe and the package it was loaded into.
    """
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    hc = HydraConfig.get()
    if all((src.schema, src.path) in _OWN_SOURCES for src in hc.runtime.config_sources):
        return
    dl = GlobalHydra.instance().config_loader().compute_defaults_list(
        hc.job.config_name, [str(o) for o in (*hc.overrides.hydra, *hc.overrides.task)], hc.mode)
    for d in dl.defaults:
        path = d.config_path or ""
        if path.startswith("recipes/"):
            name = path[len("recipes/"):]
            recipe_files.check_name(name, "recipes")
            if d.package != f"recipes.{name}":
                raise RecipeError(
                    f"recipe '{name}' (recipes/{name}.yaml): a recipe file may set only recipes.{name}; "
                    f"it was loaded into package '{d.package or '_global_'}'")


#: top-level sections every run needs (``~calibration`` deletes one)
SECTIONS = ("hardware", "calibration", "energy", "run")


def _raw_value(cfg, key: str):
    """The text of ``key`` in ``cfg`` before interpolation (``a.b[0].c``)."""
    from omegaconf import OmegaConf
    node = OmegaConf.to_container(cfg, resolve=False)
    for part in re.findall(r"[^.\[\]]+", key):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return node


def check_config(cfg) -> None:
    """The composed config, before kbframe reads it: every section a run needs is there,
    and every value resolves (an interpolation in an override, ``${oc.env:NOPE}`` or a
    cycle, is an error naming the key, not a traceback from wherever it is first read),
    within the budgets of :func:`kbframe.yaml_values.check_resolves` (20,000 values).

    Raises:
        ConfigError: names the key and why.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    for sec in SECTIONS:
        if sec not in cfg:
            raise ConfigError(f"the config has no '{sec}' section (deleted with ~{sec}?); every run needs "
                              f"{', '.join(SECTIONS)}")
    check_resolves(cfg)
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        key = e.full_key or "?"
        raw = _raw_value(cfg, key) if e.full_key else None
        why = str(e.msg or e).splitlines()[0] if str(e.msg or e).strip() else type(e).__name__
        text = f" '{raw}'" if isinstance(raw, str) else ""
        raise ConfigError(f"{key}: cannot resolve{text}: {why}") from None


def _is_multirun(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun") for a in argv)


def _default_dir(key: str) -> str:
    """``hydra.run.dir`` / ``hydra.sweep.dir`` as conf/config.yaml sets it (unresolved)."""
    from omegaconf import OmegaConf
    node = OmegaConf.load(_CONF / "config.yaml")
    return str(OmegaConf.to_container(node, resolve=False)["hydra"][key.split(".")[1]]["dir"])


def _writable_prefix(val: str) -> str | None:
    """For a directory holding ``${...}``: None if the nearest existing folder above its
    literal part is a directory that accepts files (Hydra creates the rest), else why."""
    head = val.split("${", 1)[0]
    p = Path(head) if head.endswith("/") or not head else Path(head).parent
    p = p if str(p) else Path(".")
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    if not p.is_dir():
        return f"'{p}' is not a directory"
    probe = p / f".kbframe-write-test-{os.getpid()}"
    try:
        with open(probe, "xb"):  # a new file, never through a link in its place
            pass
        probe.unlink()
    except OSError as e:
        return f"'{p}': {e.strerror or e}"
    return None


def run_dir_arg(argv: list[str]) -> tuple[str, str | None]:
    """``(key, value)`` of the run directory this command line names (``hydra.sweep.dir``
    with ``-m``), value None when it leaves the default."""
    key = "hydra.sweep.dir" if _is_multirun(argv) else "hydra.run.dir"
    val = None
    for a in argv:
        k, eq, v = a.partition("=")
        if eq and k.lstrip("+") == key:
            val = v
    return key, val


def check_run_dir(argv: list[str]) -> str | None:
    """Why the run (or sweep) directory cannot be written, or None: an empty one (it would
    mean the working directory), one that cannot be created, and one holding ``${...}``
    (the default too) whose existing part is not a writable directory."""
    key, val = run_dir_arg(argv)
    if val is not None and not val.strip():
        return f"{key} is empty; give a directory (the default is {_default_dir(key)})"
    text = val if val is not None else _default_dir(key)
    why = _writable_prefix(text) if "${" in text else _writable_dir(text, keep=key == "hydra.run.dir")
    if why is not None:
        return f"cannot write the run directory '{text}' ({key}): {why}"
    return None


_SAFE_CALLBACK_KEYS = ("hydra.callbacks.sweep_report.enabled", "hydra.callbacks.sweep_report.reuse_dir",
                       "hydra.callbacks.sweep_report.x")
#: sweeper keys that would run code (a dotted path the sweeper calls) or write outside the
#: sweep directory (an Optuna storage URL such as sqlite:///elsewhere.db)
_UNSAFE_SWEEPER_KEYS = ("hydra.sweeper.custom_search_space", "hydra.sweeper.storage")


def check_hydra_code(argv: list[str]) -> str | None:
    """Hydra builds objects from some of its own keys before kbframe's code runs: a
    callback's ``_target_`` (any callable: ``pathlib.Path.touch`` writes a file), a
    logging handler's ``()`` factory, any ``_target_``. Overrides of those are refused;
    ``hydra.callbacks.sweep_report.enabled`` / ``reuse_dir`` are kbframe's own switches."""
    for a in argv:
        key, eq, val = a.partition("=")
        key = key.lstrip("+~")
        if not key.startswith("hydra.") and not key.startswith("hydra/"):
            continue
        code = ("_target_" in key or "()" in key or "_target_" in val or "()" in val
                or key.startswith(("hydra.job_logging", "hydra.hydra_logging"))
                or (key.startswith("hydra.callbacks") and key not in _SAFE_CALLBACK_KEYS)
                or key == "hydra/callbacks" or key in _UNSAFE_SWEEPER_KEYS)
        if code:
            return (f"{key}: kbframe does not take this override: Hydra would build objects from it before any "
                    f"check (a _target_ is code) or write outside the sweep directory; on the command line only "
                    f"hydra.callbacks.sweep_report.enabled, .reuse_dir and .x of Hydra's callbacks may be set")
    return None


def check_group_names(argv: list[str]) -> str | None:
    """Every config group choice on the command line (``+bench=NAME``, ``hydra/launcher=NAME``,
    any key without a dot, comma lists and sweep functions of a sweep included) is a name,
    never a path (kbframe.cli.hydra_guard.check_choice; the guard checks the composed
    config's choices again, whatever file made them)."""
    from .hydra_guard import check_choice
    for a in argv:
        key, eq, val = a.partition("=")
        key = key.lstrip("+~")
        if not eq or a.startswith("-") or "." in key.split("@", 1)[0] or key in ("recipes",) or not key:
            continue
        for tok in re.findall(r"[^\[\],()\s'\"]+", val):
            if tok in _SWEEP_FUNCS or tok == "null":
                continue
            try:
                check_choice(key.split("@", 1)[0], tok)
            except KbframeError as e:
                return str(e)
    return None


def check_sweeper(argv: list[str]) -> str | None:
    """``+search=NAME`` needs Hydra's Optuna sweeper; without it Hydra's message would be a
    missing config group option."""
    import importlib.util
    for a in argv:
        key, eq, val = a.partition("=")
        if eq and key.lstrip("+~") == "search" and not key.startswith("~") \
                and importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None:
            return (f"+search={val} needs Hydra's Optuna sweeper, which is not installed: "
                    f"pip install -e '.[optuna]' (make installs it)")
    return None


def check_one_search(argv: list[str]) -> str | None:
    """``+search=`` names one search config: a comma list would make a grid of searches."""
    for a in argv:
        key, eq, val = a.partition("=")
        if eq and key.lstrip("+~") == "search" and ("," in val or "(" in val):
            return f"+search={val}: name one search config (available: {', '.join(available('search'))})"
    return None


#: Hydra's mode flags (long name, short name): it takes one of them
_MODES = (("--run", "-r"), ("--multirun", "-m"), ("--cfg", "-c"), ("--info", "-i"), ("--shell-completion", "-sc"))


def check_one_mode(argv: list[str]) -> str | None:
    """Hydra takes one of ``--run``, ``--multirun``, ``--cfg``, ``--info`` and
    ``--shell-completion``; two of them would be its ValueError's traceback."""
    given = [a for a in argv if any(a in m or a.startswith(m[0] + "=") for m in _MODES)]
    if len(given) > 1:
        return (f"{given[0]} and {given[1]} cannot be given together: Hydra takes one of "
                f"{', '.join(m[0] for m in _MODES)} (a sweep's config prints without -m: +sweep=NAME --cfg job)")
    return None


def precheck(argv: list[str]) -> str | None:
    """The one-line message for a command line Hydra would reject, or None."""
    msg = (check_hydra_code(argv) or check_one_mode(argv) or check_group_names(argv) or check_sweeper(argv)
           or check_one_search(argv))
    if msg is not None:
        return msg
    try:
        check_recipes(argv)
    except KbframeError as e:
        return str(e)
    msg = check_run_dir(argv)
    if msg is not None:
        return msg
    if any(a in ("-cd", "--config-dir", "-cp", "--config-path") or a.startswith(("--config-dir=", "--config-path="))
           or a.lstrip("+").startswith("hydra.searchpath") for a in argv):
        return None
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
    return None

"""What Hydra builds or reads from its own keys, checked on the composed config.

Hydra builds objects from some of its own keys before kbframe's task function runs: the
callbacks (``hydra.callbacks.NAME._target_``), the logging set-up (``hydra.hydra_logging``,
``hydra.job_logging``: a handler's ``class``, any ``()`` factory, ``ext://`` names it
imports), the launcher and the sweeper (with the Optuna sampler, its storage and custom
search space). A config file can set any of them: a bench on ``hydra.searchpath`` headed
``# @package _global_``, a group choice, an override. So the rule is checked where all of
these meet, on every composed config (the run's, a sweep's and each job's), right after
Hydra's config loader composes it and before anything is built from it
(:func:`install` wraps ``ConfigLoaderImpl.load_configuration``). DESIGN.md decision 1:
every ``_target_`` is checked by what it must be, not by its text.

By kind:

* ``hydra.callbacks.NAME``: a Hydra callback class defined in kbframe;
* the launcher and the sweeper: a Hydra plugin class of that kind; the Optuna sampler: a
  sampler class of ``optuna.samplers``; no Optuna ``storage`` (a database written outside
  the sweep directory); a ``custom_search_space`` only from ``kbframe.cli.search_space``;
  no submitit ``setup`` lines (shell commands), its folder under ``${hydra.sweep.dir}``;
* logging: handlers of logging's own StreamHandler (to stdout or stderr), NullHandler or
  FileHandler kinds, a file handler writing a ``.log`` file in the run directory
  (``${hydra.runtime.output_dir}/NAME.log``); formatters of logging's own Formatter; no
  ``()`` factory and no other ``ext://`` name;
* no other ``_target_`` anywhere in ``hydra``;
* every config group choice (``hydra.runtime.choices``: bench, hardware, model, sweep,
  search, Hydra's own groups and any added later) is a name, never a path;
* the paths Hydra places under the run or sweep directory stay in it: ``hydra.output_subdir``
  (the run's ``.hydra/``) and ``hydra.sweep.subdir`` (a job's folder) are relative, without
  ``..``, interpolating only ``${hydra.job.num}``, ``${hydra.job.id}`` or ``${hydra.job.name}``;
  ``hydra.job.name`` (in the log file's name) is a name. ``hydra.run.dir`` and
  ``hydra.sweep.dir`` are where the user chose to write: checked for being writable
  (:mod:`kbframe.cli.checks`), not for where they are.

What Hydra builds from is checked as it will build it: a value of those sections that is an
interpolation of another node stands for that node (:func:`expand`), and one a resolver
would make into a node (``oc.create``) is refused. Every entry of the config search path is
checked before Hydra makes a source of it (:func:`check_search_path`): a folder or kbframe's
and Hydra's own packages, never another module, which Hydra would import. A config file in
a folder is checked before it is read: its size, UTF-8, and the values its YAML aliases would
expand it to, with those of the files read before it for the same config (kbframe.yaml_values).

Every defaults list of every config file Hydra reads is checked as the file is read, before
any of its entries is loaded (:func:`install` wraps ``ConfigRepository.load_config``): each
group path and each choice is a name in the config tree (``/bench/decode_opt2@bench``,
``override /hardware: cube``), never a path out of it (``/../../elsewhere/g@hardware``).

A refusal is one line naming the key (or the defaults-list entry), what it holds and where
it was set (the command line or the config file), raised as Hydra's own composition error,
which :mod:`kbframe.cli.hydra_errors` prints as ``kbframe: error: ...``. Hydra's private
names used here are reached through :mod:`kbframe.internals` (``KEPT``).
"""
from __future__ import annotations

import inspect
import os
import re
from pathlib import PurePosixPath

from ..errors import ConfigError
from ..yaml_values import (MAX_YAML_VALUES, YamlRefused, check_resolves, checked_values, composition_budget,
                           container_values, read_yaml_text)

#: a config group choice: a plain name (no path separator, no '..')
_CHOICE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_STREAMS = ("ext://sys.stdout", "ext://sys.stderr")
_LOG_FILE = re.compile(r"\$\{hydra[.:]runtime\.output_dir\}/(?P<name>(?:[A-Za-z0-9_.\-]|\$\{hydra[.:]job\.name\})+)")
_OWN_FILES = ("metrics.json", "op_log.jsonl", "tensors.npz", "trace.json", "status.json")
#: what a folder Hydra places under the run or sweep directory may interpolate
_SUBDIR_VARS = re.compile(r"\$\{hydra[.:]job\.(?:num|id|name)\}")


def check_choice(group: str, choice) -> None:
    """A config group choice is a plain name. Raises ConfigError naming it."""
    for name in choice if isinstance(choice, (list, tuple)) else [choice]:
        if name is None:
            continue
        text = str(name)
        if not _CHOICE.fullmatch(text) or ".." in text:
            raise ConfigError(f"{group} '{text}': a config group choice is a name (of a file in {group}/ on the "
                              f"config search path), never a path")


def _walk(node, prefix: str):
    """``(dotted key, value)`` of every leaf and node under ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}.{k}"
            yield key, v
            yield from _walk(v, key)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            key = f"{prefix}[{i}]"
            yield key, v
            yield from _walk(v, key)


class Refusal(Exception):
    """One refused key: ``key``, the rest of the message (``what``)."""

    def __init__(self, key: str, what: str, choice=None):
        super().__init__(key, what)
        self.key, self.what, self.choice = key, what, choice


def _class_of(text, key: str, prefixes: tuple, base, kind: str):
    """The class ``text`` names, if it starts with one of ``prefixes`` (checked before any
    import) and is a subclass of ``base``; else Refusal."""
    from ..sim.targets import describe, locate
    if not isinstance(text, str) or "${" in text or not text.startswith(prefixes):
        raise Refusal(key, f"'{text}' is not {kind}")
    try:
        obj = locate(text, key, allow_external=True)
    except ConfigError:
        raise Refusal(key, f"'{text}' does not import; it must be {kind}") from None
    if not (inspect.isclass(obj) and issubclass(obj, base) and obj is not base):
        raise Refusal(key, f"'{text}' is {describe(obj)}, not {kind}")
    return obj


def _check_callbacks(callbacks) -> None:
    from hydra.experimental.callback import Callback
    if callbacks is not None and not isinstance(callbacks, dict):
        raise Refusal("hydra.callbacks", f"{callbacks!r} is not a mapping of callbacks")
    for name, cb in (callbacks or {}).items():
        key = f"hydra.callbacks.{name}"
        if not isinstance(cb, dict) or "_target_" not in cb:
            raise Refusal(key, "is not a callback (a mapping with a _target_)")
        obj = _class_of(cb["_target_"], key + "._target_", ("kbframe.",), Callback,
                        "a Hydra callback class defined in kbframe (kbframe.cli.callbacks.SweepReport)")
        if not (obj.__module__ or "").startswith("kbframe."):
            raise Refusal(key + "._target_", f"'{cb['_target_']}' is a class defined in {obj.__module__}, not a "
                                             f"Hydra callback class defined in kbframe")


def _check_plugin(node, key: str, base, kind: str) -> None:
    from hydra.core.plugins import Plugins
    if not isinstance(node, dict) or "_target_" not in node:
        return
    text = node["_target_"]
    if not isinstance(text, str) or text not in Plugins.instance().class_name_to_class:
        raise Refusal(key + "._target_", f"'{text}' is not a Hydra {kind} plugin")
    if not issubclass(Plugins.instance().class_name_to_class[text], base):
        raise Refusal(key + "._target_", f"'{text}' is not a Hydra {kind} plugin")


def _check_sweeper(sw) -> None:
    from hydra.plugins.sweeper import Sweeper
    if not isinstance(sw, dict):
        return
    _check_plugin(sw, "hydra.sweeper", Sweeper, "sweeper")
    if sw.get("storage") is not None:
        raise Refusal("hydra.sweeper.storage", f"'{sw['storage']}' would make Optuna write a database outside the "
                                               f"sweep directory; kbframe takes none")
    rate = sw.get("max_failure_rate")  # Optuna's sweeper asserts it, with no message
    if rate is not None and not (isinstance(rate, str) and "${" in rate) and not (
            isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 <= rate <= 1):
        raise Refusal("hydra.sweeper.max_failure_rate", f"must be a number from 0 to 1 (the share of trials "
                                                        f"that may fail), got {rate!r}")
    css = sw.get("custom_search_space")
    if css is not None:
        from ..sim.targets import describe, locate
        ok = isinstance(css, str) and css.startswith("kbframe.cli.search_space.") and "${" not in css
        obj = locate(css, "hydra.sweeper.custom_search_space") if ok else None
        if not (ok and inspect.isfunction(obj) and obj.__module__ == "kbframe.cli.search_space"):
            what = describe(obj) if obj is not None else "not one"
            raise Refusal("hydra.sweeper.custom_search_space",
                          f"'{css}' is {what}; the sweeper calls it, so it must be a function of "
                          f"kbframe.cli.search_space")
    sampler = sw.get("sampler")
    if isinstance(sampler, dict) and "_target_" in sampler:
        try:
            from optuna.samplers import BaseSampler
        except ImportError:
            raise Refusal("hydra.sweeper.sampler._target_", "needs optuna, which is not installed") from None
        _class_of(sampler["_target_"], "hydra.sweeper.sampler._target_", ("optuna.samplers.",), BaseSampler,
                  "a sampler class of optuna.samplers")


def _check_launcher(la) -> None:
    from hydra.plugins.launcher import Launcher
    if not isinstance(la, dict):
        return
    _check_plugin(la, "hydra.launcher", Launcher, "launcher")
    if la.get("setup"):
        raise Refusal("hydra.launcher.setup", f"{la['setup']!r} are shell commands the launcher would run; "
                                              f"kbframe takes none from a config")
    folder = la.get("submitit_folder")
    if folder is not None and (not str(folder).startswith("${hydra.sweep.dir}/") or ".." in str(folder)):
        raise Refusal("hydra.launcher.submitit_folder", f"'{folder}' would write outside the sweep directory; "
                                                        f"it must start with ${{hydra.sweep.dir}}/")


def _check_logging(log, section: str) -> None:
    import logging
    import logging.handlers  # noqa: F401 (the handler classes a config may name)
    if not isinstance(log, dict):
        return
    prefix = f"hydra.{section}"
    for key, v in _walk(log, prefix):
        if key.endswith(".."):  # the '.' key: attributes set on the object logging builds
            raise Refusal(key[:-1] + "'.'", f"{v!r} sets attributes on the object logging builds (its '.' key); "
                                            f"kbframe takes none")
        if key.endswith(".()"):
            raise Refusal(key, f"'{v}' is a logging factory, which runs any callable; kbframe takes none")
        if isinstance(v, str) and v.startswith("ext://") and not (key.endswith(".stream") and v in _STREAMS):
            raise Refusal(key, f"'{v}' makes logging import a name; only a handler's stream may be "
                               f"{' or '.join(_STREAMS)}")
    for name, h in (log.get("handlers") or {}).items():
        key = f"{prefix}.handlers.{name}"
        if not isinstance(h, dict):
            continue
        cls = _class_of(h.get("class"), key + ".class", ("logging.",), logging.Handler,
                        "logging's own StreamHandler, FileHandler or NullHandler")
        if not (cls.__module__ in ("logging", "logging.handlers")
                and issubclass(cls, (logging.StreamHandler, logging.NullHandler))):
            raise Refusal(key + ".class", f"'{h.get('class')}' is not logging's own StreamHandler, FileHandler "
                                          f"or NullHandler")
        if issubclass(cls, logging.FileHandler):
            fn = h.get("filename")
            m = _LOG_FILE.fullmatch(str(fn)) if isinstance(fn, str) else None
            base = m["name"] if m else ""
            if not m or ".." in base or not base.endswith(".log") or base in _OWN_FILES:
                raise Refusal(key + ".filename", f"'{fn}': a log file is a NAME.log in the run directory, "
                                                 f"${{hydra.runtime.output_dir}}/NAME.log")
    for name, f in (log.get("formatters") or {}).items():
        if isinstance(f, dict) and "class" in f:
            cls = _class_of(f["class"], f"{prefix}.formatters.{name}.class", ("logging.",), logging.Formatter,
                            "logging's own Formatter")
            if cls.__module__ != "logging":
                raise Refusal(f"{prefix}.formatters.{name}.class", f"'{f['class']}' is not logging's own Formatter")


_CHECKED = ("callbacks", "launcher", "sweeper", "hydra_logging", "job_logging")
#: a value that is one interpolation as a whole: it becomes what it names, a node too
_WHOLE = re.compile(r"\$\{(?P<body>[^${}]*)\}")
#: ... of a config key, by its absolute path (checked as the node it names)
_KEY_REF = re.compile(r"[A-Za-z_][\w\-]*(?:\.[\w\-]+|\[\d+\])*")
#: ... of a resolver that makes a string
_TEXT_RESOLVERS = ("hydra:", "now:")


def expand(hydra: dict, cfg) -> dict:
    """``hydra`` (the unresolved ``hydra`` node of the composed config ``cfg``) with every
    value of the sections Hydra builds objects from (:data:`_CHECKED`) that is one
    interpolation as a whole replaced by the node it names: what Hydra would build from
    is checked, not the ``${...}`` that stands for it (a callback's parameter naming a
    top-level node with a ``_target_``). Raises Refusal for such a value that a resolver
    other than ``hydra:`` or ``now:`` makes (``oc.create`` builds a node from text), or
    that names a key relatively."""
    from omegaconf import OmegaConf

    def sub(v, key: str, level: int):
        if isinstance(v, dict):
            return {k: sub(x, f"{key}.{k}", level) for k, x in v.items()}
        if isinstance(v, list):
            return [sub(x, f"{key}[{i}]", level) for i, x in enumerate(v)]
        text = v.strip() if isinstance(v, str) else ""
        if not (text.startswith("${") and text.endswith("}")):  # text around an interpolation: a string
            return v
        m = _WHOLE.fullmatch(text)
        if m is not None and m["body"].startswith(_TEXT_RESOLVERS):
            return v
        body = m["body"].strip() if m is not None else ""
        if not _KEY_REF.fullmatch(body) or level > 8:
            raise Refusal(key, f"'{v}': in {', '.join('hydra.' + c for c in _CHECKED)} a value that is an "
                               f"interpolation must name a key by its full path (or be ${{hydra:...}} or "
                               f"${{now:...}}): Hydra builds objects from these sections")
        try:
            node = OmegaConf.select(cfg, body, throw_on_missing=False)
        except Exception:  # noqa: BLE001 (it does not resolve: Hydra refuses it too, nothing is built)
            return v
        if OmegaConf.is_config(node):
            return sub(OmegaConf.to_container(node, resolve=False), key, level + 1)
        return sub(node, key, level + 1) if isinstance(node, str) else v
    out = dict(hydra)
    for section in _CHECKED:
        if section in out:
            out[section] = sub(out[section], f"hydra.{section}", 0)
    return out


def _check_paths(hydra: dict) -> None:
    """The folders Hydra places under the run or sweep directory stay in it (module doc)."""
    for key, node, where in (("hydra.output_subdir", hydra, "output_subdir"),
                             ("hydra.sweep.subdir", hydra.get("sweep") or {}, "subdir")):
        v = node.get(where) if isinstance(node, dict) else None
        if v is None:
            continue
        text = str(v)
        rest = _SUBDIR_VARS.sub("0", text)  # an allowed interpolation stands for a plain name
        if "${" in rest or rest.startswith(("/", "\\")) or ".." in PurePosixPath(rest.replace("\\", "/")).parts:
            what = "sweep" if "sweep" in key else "run"
            raise Refusal(key, f"'{text}' would write outside the {what} directory; give a relative path without "
                               f"'..' (it may interpolate ${{hydra.job.num}}, ${{hydra.job.id}} or "
                               f"${{hydra.job.name}})")
    name = (hydra.get("job") or {}).get("name")
    if name is not None and name != "???" and (not _CHOICE.fullmatch(str(name)) or ".." in str(name)):
        raise Refusal("hydra.job.name", f"'{name}' is not a name; Hydra puts it in the log file's path "
                                        f"(${{hydra.runtime.output_dir}}/${{hydra.job.name}}.log)")


def check_hydra(hydra: dict) -> None:
    """The rules of the module doc on the unresolved ``hydra`` node of a composed config
    (its interpolated nodes in place, :func:`expand`).

    Raises:
        Refusal: the first key that breaks them.
    """
    for group, choice in ((hydra.get("runtime") or {}).get("choices") or {}).items():
        try:
            check_choice(group, choice)
        except ConfigError as e:
            raise Refusal(_CHOICES + group, str(e), choice) from None
    _check_paths(hydra)
    _check_callbacks(hydra.get("callbacks"))
    _check_launcher(hydra.get("launcher"))
    _check_sweeper(hydra.get("sweeper"))
    for section in ("hydra_logging", "job_logging"):
        _check_logging(hydra.get(section), section)
    allowed = {"hydra.launcher._target_", "hydra.sweeper._target_", "hydra.sweeper.sampler._target_"}
    for key, v in _walk(hydra, "hydra"):
        if key.endswith("._target_") and key not in allowed and not re.fullmatch(r"hydra\.callbacks\.[^.]+\._target_", key):
            raise Refusal(key, f"'{v}' is an object Hydra would build before any check; in hydra a config may set "
                               f"_target_ only for hydra.callbacks, the launcher, the sweeper and its sampler")


_CHOICES = "hydra.runtime.choices."


def _file(res, config_path: str) -> str:
    where = str(res.path)
    where = where[len("file://"):] if where.startswith("file://") else where
    return f"{where}/{config_path}.yaml"


def source_of(loader, config_name, overrides, run_mode, key: str, choice=None) -> str:
    """Where ``key`` of the composed config was set: ``the command line (OVERRIDE)`` or
    ``FILE`` (the last config of the defaults list that sets it), else ``the config``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ..internals import defaults_list
    dot = key.endswith(".'.'")  # logging's '.' key
    parts = re.findall(r"[^.\[\]]+", key[:-4] if dot else key) + (["."] if dot else [])
    group = key[len(_CHOICES):] if key.startswith(_CHOICES) else None
    try:
        for ov in reversed(OverridesParser.create().parse_overrides(list(overrides))):
            k = ov.key_or_group
            if k == group or (group is None and "/" not in k and parts[:len(k.split("."))] == k.split(".")):
                return f"the command line ({ov.input_line})"
        dl, repo = defaults_list(loader, config_name, overrides, run_mode)
        if group is not None:  # the last config whose defaults list chose it
            for d in reversed(dl.defaults):
                res = repo.load_config(d.config_path) if d.config_path else None
                for item in (res.defaults_list or []) if res is not None else []:
                    g = str(getattr(item, "group", None) or "").lstrip("/")
                    if g and (g == group or group.endswith("/" + g)) and getattr(item, "value", None) == choice:
                        return _file(res, d.config_path)
            return "the config"
        for d in reversed(dl.defaults):
            if d.config_path is None:
                continue
            res = repo.load_config(d.config_path)
            if res is None:
                continue
            node = OmegaConf.to_container(res.config, resolve=False)
            pkg = [p for p in (d.package or "").split(".") if p and p != "_global_"]
            if parts[:len(pkg)] != pkg:
                continue
            for p in parts[len(pkg):]:
                if isinstance(node, str) and node.strip().startswith("${"):
                    break  # an interpolation this file sets stands for the rest of the key
                node = node.get(p) if isinstance(node, dict) else None
                if node is None:
                    break
            else:
                return _file(res, d.config_path)
            if isinstance(node, str) and node.strip().startswith("${"):
                return _file(res, d.config_path)
    except (HydraException, OmegaConfBaseException):  # a config Hydra cannot read again: the refusal stands
        pass
    return "the config"


def _entry_text(d) -> str:
    """A defaults-list entry as written (``/g@pkg: choice``, ``/g/name@pkg``)."""
    pkg = f"@{d.package}" if getattr(d, "package", None) else ""
    if hasattr(d, "group"):
        value = d.value if not isinstance(d.value, (list, tuple)) else f"[{', '.join(map(str, d.value))}]"
        return f"{'override ' if getattr(d, 'override', False) else ''}{d.group}{pkg}: {value}"
    return f"{d.path}{pkg}"


#: the values of each config file read from a folder so far for the config being composed
_values_read: dict[str, int] = {}
#: the values of each config merged into the config being composed (by config path)
_values_merged: dict[str, int] = {}
#: the config being composed so far: its values, each config counted each time it is
#: merged, and its merges
_merged = {"values": 0, "merges": 0}
#: configs one composition merges (kbframe's own: a few dozen, Hydra's included)
MAX_MERGES = 256


def _file_to_read(repo, config_path: str) -> str | None:
    """The file Hydra's config repository ``repo`` would read for ``config_path``, if a
    folder on the search path holds it (the first source that has it, as Hydra picks);
    None for a package's or a structured config."""
    for source in repo.get_sources():
        if source.is_config(config_path):
            if source.scheme() != "file":
                return None
            name = config_path if config_path.endswith(".yaml") else f"{config_path}.yaml"  # as Hydra 1.3 names it
            return os.path.join(source.path, name)
    return None


def check_defaults(defaults, where: str) -> None:
    """Every entry of one config file's parsed defaults list names a config in the config
    tree: its group path (``/hydra/launcher``) and choice, or its config path
    (``/bench/decode_opt2``), are names joined by '/', never '..' or an empty part.
    ``where``: the file, for the message.

    Raises:
        ConfigCompositionException: one line naming the entry and the file.
    """
    from hydra.errors import ConfigCompositionException
    for d in defaults or []:
        path = getattr(d, "group", None) if hasattr(d, "group") else getattr(d, "path", None)
        if path is None or "${" in str(path):
            continue  # an interpolated entry: its resolved choice is checked (hydra.runtime.choices)
        parts = str(path).lstrip("/").split("/")
        bad = [p for p in parts if not _CHOICE.fullmatch(p) or ".." in p]
        if bad:
            raise ConfigCompositionException(
                f"defaults entry '{_entry_text(d)}': a defaults list names a config group and a config in the "
                f"config tree (names joined by '/', as /bench/decode_opt2), never a path out of it ('{bad[0]}') "
                f"(set in {where})")
        if hasattr(d, "group"):
            values = d.value if isinstance(d.value, (list, tuple)) else [d.value]
            for v in values:
                if v is None or v == "???" or "${" in str(v):
                    continue
                try:
                    check_choice(str(path).lstrip("/"), v)
                except ConfigError as e:
                    raise ConfigCompositionException(f"{e} (set in {where})") from None


#: the packages a ``pkg://`` search path entry may name: kbframe's and Hydra's own, and its
#: plugins' (imported by Hydra's plugin discovery in any case)
_OWN_PACKAGES = re.compile(r"(?:kbframe|hydra|hydra_plugins)(?:\.[A-Za-z_]\w*)*")


def check_search_path(entry: str) -> None:
    """A config search path entry Hydra would make a source of (``hydra.searchpath``, a
    ``--config-dir``): a folder (``file://DIR``), a package of kbframe's or Hydra's own
    (``pkg://kbframe``), or Hydra's config store (``structured://``). Any other package would
    be imported, its code run, to read configs from it.

    Raises:
        ConfigCompositionException: one line naming the entry."""
    from hydra.errors import ConfigCompositionException
    scheme, sep, rest = entry.partition("://")
    if not sep or scheme == "file":
        return
    if (scheme == "pkg" and _OWN_PACKAGES.fullmatch(rest)) or (scheme == "structured" and rest == ""):
        return
    raise ConfigCompositionException(
        f"hydra.searchpath entry '{entry}': Hydra would import that module to read configs from it, running its "
        f"code; a search path entry names a folder (file://DIR) or kbframe's own configs (pkg://kbframe)")


def _null_parent(cfg, key: str) -> str:
    """The first key on the way to ``key``, or ``key``, whose value is null (``key``'s parent
    if none)."""
    from omegaconf import OmegaConf
    parts = key.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if OmegaConf.select(cfg, prefix, throw_on_missing=False) is None:
            return prefix
    return ".".join(parts[:-1]) or key


def _check_hydra_resolves(cfg) -> None:
    """:func:`~kbframe.yaml_values.check_resolves` on Hydra's section of ``cfg``, with
    ``${hydra:...}`` answered from it, as Hydra answers it once it runs a job (the text of the
    overrides it records is not resolved)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf
    hc = HydraConfig.instance()
    saved, hc.cfg = hc.cfg, OmegaConf.masked_copy(cfg, "hydra")
    try:
        check_resolves(cfg.hydra, "hydra", skip=("hydra.overrides",))
    finally:
        hc.cfg = saved


def install() -> None:
    """Wrap Hydra's config loader so that every composed config is checked, and its config
    repository so that every file's defaults list is checked as it is read (idempotent)."""
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf

    from ..internals import config_loader_class, config_repository_class
    ConfigLoaderImpl, ConfigRepository = config_loader_class(), config_repository_class()
    original = ConfigLoaderImpl.load_configuration
    if getattr(original, "__kbframe_guard__", False):
        return
    load_config = ConfigRepository.load_config

    def checked_load_config(self, config_path, *args, **kwargs):
        path = _file_to_read(self, config_path)
        if path is not None:
            try:
                before = sum(n for p, n in _values_read.items() if p != path)  # a file read again counts once
                _values_read[path] = checked_values(read_yaml_text(path), path, before)
            except YamlRefused as e:
                raise ConfigCompositionException(str(e)) from None
            except OSError:
                pass  # Hydra's own loading names what is wrong with the file
        res = load_config(self, config_path, *args, **kwargs)
        if res is not None:
            check_defaults(res.defaults_list, _file(res, config_path))
        return res
    ConfigRepository.load_config = checked_load_config
    initialize_sources = ConfigRepository.initialize_sources

    def checked_initialize_sources(self, config_search_path, *args, **kwargs):
        for sp in config_search_path.get_path():
            check_search_path(str(sp.path))
        return initialize_sources(self, config_search_path, *args, **kwargs)
    ConfigRepository.initialize_sources = checked_initialize_sources

    apply_overrides = ConfigLoaderImpl._apply_overrides_to_config

    def checked_apply_overrides(overrides, cfg):
        for override in overrides:  # one at a time, in order, as Hydra applies them
            try:
                apply_overrides([override], cfg)
            except (AssertionError, AttributeError):  # OmegaConf.update's, merging into a null value
                key = override.key_or_group
                null = _null_parent(cfg, key)
                what = "nothing can be merged into it" if null == key else "no key can be added below it"
                raise ConfigCompositionException(
                    f"Error merging override {override.input_line}: {null} is null, so {what} from the command "
                    f"line; set {null} in a config file instead (as conf/sweep/*.yaml set hydra.sweeper.params)") \
                    from None
    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(checked_apply_overrides)

    load_single_config = ConfigLoaderImpl._load_single_config

    def counted_load_single_config(self, default, repo):
        res = load_single_config(self, default, repo)
        n = _values_merged.get(default.config_path)
        if n is None:  # a config's own values, counted once: its text is the same each time
            n = _values_merged[default.config_path] = container_values(
                OmegaConf.to_container(res.config, resolve=False))
        _merged["values"] += n
        _merged["merges"] += 1
        total = _merged["values"]
        if _merged["merges"] > MAX_MERGES:  # each merge walks the config so far: their cost grows as their square
            where = _file_to_read(repo, default.config_path) or default.config_path
            raise ConfigCompositionException(
                f"config '{where}': the config merges more than {MAX_MERGES} configs (each as many times as a "
                f"defaults list names it); a config merges at most {MAX_MERGES}")
        if total > MAX_YAML_VALUES:
            where = _file_to_read(repo, default.config_path) or default.config_path
            raise ConfigCompositionException(
                f"config '{where}': merged with the configs before it (each as many times as a defaults list "
                f"names it), the config holds more than {MAX_YAML_VALUES:,} values; a config holds at most "
                f"{MAX_YAML_VALUES:,}")
        return res
    ConfigLoaderImpl._load_single_config = counted_load_single_config

    def load_configuration(self, config_name, overrides, run_mode, *args, **kwargs):
        _values_read.clear()  # the files of one composed config count together
        _values_merged.clear()
        _merged.update(values=0, merges=0)
        try:
            with composition_budget():
                cfg = original(self, config_name, overrides, run_mode, *args, **kwargs)
        except ConfigError as e:
            raise ConfigCompositionException(str(e)) from None
        except KeyError as e:  # hydra.job.env_copy names a variable the environment does not have
            name = e.args[0] if e.args else ""
            files, tb = [], e.__traceback__
            while tb is not None:
                files.append(tb.tb_frame.f_code.co_filename)
                tb = tb.tb_next
            from_environ = (files[-1] in (os.__file__, "<frozen os>")  # os.environ[name], in Hydra's loader
                            and any(f.endswith("config_loader_impl.py") for f in files))
            if not isinstance(name, str) or name in os.environ or not from_environ:
                raise
            raise ConfigCompositionException(f"hydra.job.env_copy: environment variable '{name}' is not set (env_copy "
                                             f"copies variables of this environment into the job's)") from None
        if "hydra" in cfg:
            try:  # before Hydra resolves hydra.run.dir, hydra.job.env_set ... unchecked
                _check_hydra_resolves(cfg)
            except ConfigError as e:
                raise ConfigCompositionException(str(e)) from None
            try:
                check_hydra(expand(OmegaConf.to_container(cfg.hydra, resolve=False), cfg))
            except Refusal as r:
                where = source_of(self, config_name, overrides, run_mode, r.key, r.choice)
                what = r.what if r.key.startswith(_CHOICES) else f"{r.key}: {r.what}"
                raise ConfigCompositionException(f"{what} (set in {where})") from None
        return cfg
    load_configuration.__kbframe_guard__ = True
    ConfigLoaderImpl.load_configuration = load_configuration

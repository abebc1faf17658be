"""Resolving the dotted names a config gives (``_target_``, ``bench.kernel``) to the objects
they must be (DESIGN.md decision 1).

A name from a config is checked twice:

* **before importing** (the text): every part a plain identifier (no ``_``-prefixed part,
  so no ``__main__``, no private helper), and the first part ``kbframe`` unless
  ``hardware.allow_external_targets=true``. Importing a module runs its code, so a name
  outside kbframe is never imported without that opt-in.
* **after importing** (the object): what the name reaches is checked by its kind and by the
  module it is *defined* in (``obj.__module__``), never by the text, so a re-export such as
  ``kbframe.run.bench.np.save`` or ``kbframe.run.bench.os.system`` is refused.
  ``allow_external_targets`` widens the module set, never the kind of object.

The names are found exactly as ``hydra.utils.instantiate`` finds them (import the first
part, then attributes, importing submodules where an attribute is missing), so the object
checked is the object Hydra builds.

Raises :class:`~kbframe.errors.ConfigError` naming the key, the name, what it reached and
what it must be.
"""
from __future__ import annotations

import importlib
import inspect
import re
from types import ModuleType

from ..errors import ConfigError, raise_interrupt_behind
from ..hw.pe_cpu import PeCpu
from ..hw.pe_scheduler import PeScheduler
from ..hw.tcm import Tcm
from ..hw.unit import Unit

_PART = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
#: attribute a kernel registered with ``@kbframe.kernels.kernel`` carries (set there; the
#: kernels layer sits above this one, so the name is spelled in both places and
#: tests/test_targets.py checks they agree)
KERNEL_MARK = "__kbframe_kernel__"
_HINT = "set hardware.allow_external_targets=true to allow it"


def _in_package(module: str | None, package: str) -> bool:
    return bool(module) and (module == package or module.startswith(package + "."))


def describe(obj) -> str:
    """What ``obj`` is, for a message: ``a function defined in numpy`` ..."""
    if isinstance(obj, ModuleType):
        return f"the module {obj.__name__}"
    if inspect.isclass(obj):
        kind = "an abstract class" if inspect.isabstract(obj) else "a class"
        return f"{kind} defined in {obj.__module__}"
    if inspect.isfunction(obj):
        return f"a function defined in {obj.__module__}"
    if inspect.isbuiltin(obj) or inspect.ismethoddescriptor(obj):
        mod = getattr(obj, "__module__", None) or getattr(getattr(obj, "__objclass__", None), "__module__", "?")
        return f"a built-in function of {mod}"
    if callable(obj):
        return f"a callable {type(obj).__name__} object"
    return f"a {type(obj).__name__} value"


def locate(dotted, key: str, allow_external: bool = False):
    """The object ``dotted`` names, imported as Hydra's ``instantiate`` would.

    Raises:
        ConfigError: a malformed name, a name outside ``kbframe.`` (unless
            ``allow_external``), or a name that does not import (names ``key``).
    """
    text = str(dotted)
    parts = text.split(".")
    if not all(_PART.fullmatch(p) for p in parts):
        raise ConfigError(f"{key} '{text}' is not a dotted name of public parts (letters, digits and _, "
                          f"no part starting with _)")
    if parts[0] != "kbframe" and not allow_external:
        raise ConfigError(f"{key} '{text}' is outside the kbframe. namespace; {_HINT}")
    try:
        obj = importlib.import_module(parts[0])
        for i in range(1, len(parts)):
            try:
                obj = getattr(obj, parts[i])
            except AttributeError:
                if not isinstance(obj, ModuleType):
                    raise ConfigError(f"{key}: cannot import '{text}': {'.'.join(parts[:i])} has no "
                                      f"attribute '{parts[i]}'") from None
                try:
                    obj = importlib.import_module(".".join(parts[:i + 1]))
                except ModuleNotFoundError:
                    raise ConfigError(f"{key}: cannot import '{text}': no module or attribute '{parts[i]}' "
                                      f"in '{'.'.join(parts[:i])}'") from None
    except ConfigError:
        raise
    except Exception as e:  # a module that fails on import (or is not installed)
        raise_interrupt_behind(e)
        raise ConfigError(f"{key}: cannot import '{text}': {type(e).__name__}: {e}") from None
    return obj


def _refuse(key: str, dotted, obj, must_be: str) -> ConfigError:
    return ConfigError(f"{key} '{dotted}' is {describe(obj)}, not {must_be}")


def resolve_class(dotted, base_cls, key: str, allow_external: bool = False, *, package: str = "kbframe"):
    """The class ``dotted`` names, if it is a concrete subclass of ``base_cls`` defined in
    ``package`` (any module with ``allow_external``).

    Args:
        base_cls: the base class (or a tuple of them) the class must subclass; the base
            itself and abstract classes are refused.
        key: the config key, for messages (``bench.workload``, ``hardware.units.x._target_``).
    Raises:
        ConfigError: not importable, outside ``package``, or not such a class.
    """
    bases = base_cls if isinstance(base_cls, tuple) else (base_cls,)
    must_be = _class_wanted(" or ".join(f"{b.__module__}.{b.__qualname__}" for b in bases), package,
                            allow_external)
    obj = locate(dotted, key, allow_external)
    ok = inspect.isclass(obj) and issubclass(obj, bases) and obj not in bases and not inspect.isabstract(obj)
    if not ok or not (allow_external or _in_package(obj.__module__, package)):
        raise _refuse(key, dotted, obj, must_be)
    return obj


def _class_wanted(base: str, package: str, allow_external: bool) -> str:
    where = "" if allow_external else f" defined in {package}"
    return f"a concrete subclass of {base}{where}"


#: unit classes that do not subclass Unit (they hold no stages): accepted as units too
_OTHER_UNITS = (PeCpu, PeScheduler, Tcm)


def resolve_unit_class(dotted, key: str, allow_external: bool = False):
    """The unit class a ``hardware.units`` ``_target_`` names: a concrete class defined in
    ``kbframe.hw`` (any module with ``allow_external``) that subclasses
    :class:`~kbframe.hw.unit.Unit` (the base itself refused) or is, or subclasses, PeCpu,
    PeScheduler or Tcm. The one place this rule lives.

    Raises:
        ConfigError: names ``key``, what the name reached and what it must be.
    """
    obj = locate(dotted, key, allow_external)
    ok = (inspect.isclass(obj) and issubclass(obj, (Unit, *_OTHER_UNITS)) and obj is not Unit
          and not inspect.isabstract(obj) and (allow_external or _in_package(obj.__module__, "kbframe.hw")))
    if not ok:
        what = "the abstract base kbframe.hw.unit.Unit" if obj is Unit else describe(obj)
        where = "" if allow_external else " defined in kbframe.hw"
        raise ConfigError(f"{key} '{dotted}' is {what}, not a unit class (a concrete class{where} that "
                          f"subclasses kbframe.hw.unit.Unit, or PeCpu, PeScheduler or Tcm)")
    return obj


def resolve_kernel(dotted, key: str = "bench.kernel", allow_external: bool = False, kwargs=None):
    """The kernel function ``dotted`` names: a plain public function defined in a
    ``kbframe.kernels.*`` module, or one registered with ``@kbframe.kernels.kernel``
    (outside kbframe only with ``allow_external``).

    Args:
        kwargs: keyword names the run passes (after the ``tl`` argument); the kernel's
            signature must accept them. None: not checked.
    Raises:
        ConfigError: names ``key``, what the name reached and what a kernel is.
    """
    obj = locate(dotted, key, allow_external)
    registered = getattr(obj, KERNEL_MARK, False) is True
    ok = inspect.isfunction(obj) and not obj.__name__.startswith("_") and (
        registered or str(obj.__module__).startswith("kbframe.kernels."))
    if not ok:
        raise _refuse(key, dotted, obj, "a kernel (a public function defined in a kbframe.kernels module, "
                                        "or registered with @kbframe.kernels.kernel)")
    if kwargs is not None:
        try:
            inspect.signature(obj).bind(None, **{k: None for k in kwargs})
        except TypeError as e:
            raise ConfigError(f"{key} '{dotted}' cannot be called as kernel(tl, {', '.join(kwargs)}): {e}") from None
    return obj

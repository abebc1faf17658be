"""Parameters declared once: each hardware, calibration, run, bench and unit parameter is a
dataclass field made by :func:`param`, carrying its unit, range, choices and description.
One checker (:func:`check`) walks a dataclass's fields and refuses a value out of its
declaration, naming the key; ``python -m kbframe --help`` and ``docs/parameters.md``
(kbframe.cli.help) are written from the same declarations.

Message shapes (docs/errors.md states them):

* a typed config node (a schema Hydra composed: the value already has its field's type):
  ``<key> must be ≥ 1, got 0`` for an int, ``<key> must be a finite number > 0, got 0.0``
  for a float (NaN and inf are refused the same way), ``<key> must be a, b or c, got 'x'``
  for a choice;
* untyped values (a unit's parameters, ``hardware.units.<unit>.<key>``, which Hydra passes
  as written): ``<key> must be a finite number, got 'abc'`` for a value that is not one
  (``got null`` for a null where a number is needed),
  then ``<key> must be > 0, got 0``, ``<key> must be a whole number, got 2.5`` and
  ``<key> must be one of a, b, got 'x'``;
* a fixed latency (``time_base``): ``<key> must be below 1e+12 ns (the time base ends at
  10^15 ps, 1000 s simulated), got 1e+13``.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from enum import Enum

from .timebase import MAX_PS, PS_PER_NS


class ParamError(ValueError):
    """A parameter outside its declaration; the message starts with the parameter's key."""


class Choice(str, Enum):
    """Base of the choice enums: a member is a str equal to its name, printed as it."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclasses.dataclass(frozen=True)
class Spec:
    """What :func:`param` declares about a field (``field.metadata["param"]``)."""

    doc: str
    unit: str = ""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: type | None = None  # a Choice enum
    listed: tuple | None = None  # the choices a message names (default: all)
    time_base: bool = False  # a duration in ns that must fit the time base

    def names(self) -> list:
        return [m.value for m in self.choices] if self.choices else []

    def range_text(self) -> str:
        """``≥ 1``, ``> 0``, ``1 to 1048576`` ... ('' without a range)."""
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None and not (self.lo_open or self.hi_open):
            return f"{lo:g} to {hi:g}" if isinstance(lo, float) else f"{lo} to {hi}"
        parts = []
        if lo is not None:
            parts.append(f"{'>' if self.lo_open else '≥'} {lo}")
        if hi is not None:
            parts.append(f"{'<' if self.hi_open else '≤'} {hi}")
        return " and ".join(parts)


def param(default=dataclasses.MISSING, *, doc: str, unit: str = "", lo=None, hi=None, lo_open: bool = False,
          hi_open: bool = False, choices: type | None = None, listed: tuple | None = None,
          time_base: bool = False, factory=dataclasses.MISSING):
    """A dataclass field declaring a parameter: its default, ``doc`` (one line), ``unit``
    (``ns``, ``GB/s``, ``bytes`` ...), a range ``lo``/``hi`` (inclusive unless ``lo_open``/
    ``hi_open``), ``choices`` (a :class:`Choice` enum; ``listed``: the ones an error message
    names, default all), ``time_base`` (a duration in ns below the time base's end) and
    ``factory`` (a default made per instance, as ``dataclasses.field(default_factory=)``)."""
    spec = Spec(doc, unit, lo, hi, lo_open, hi_open, choices, tuple(listed) if listed else None, time_base)
    if time_base and lo is None:
        spec = dataclasses.replace(spec, lo=0)
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={"param": spec})
    return dataclasses.field(default=default, metadata={"param": spec})


def duration(default=dataclasses.MISSING, *, doc: str):
    """A fixed latency in ns: ≥ 0 and below the time base's end (kbframe.timebase)."""
    return param(default, doc=doc, unit="ns", lo=0, time_base=True)


def declared(cls) -> list:
    """``[(name, type, Spec, default)]`` of a dataclass's declared parameters, in order;
    ``type`` is ``int``, ``float``, ``bool``, ``str`` or the field's choice enum."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("param")
        if spec is None:
            continue
        kind = spec.choices or _base(hints.get(f.name))
        default = f.default if f.default is not dataclasses.MISSING else None
        out.append((f.name, kind, spec, default))
    return out


def _base(tp):
    """The plain type of an annotation (``Optional[int]`` → int)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args and typing.get_origin(tp) is typing.Union:
        return _base(args[0])
    return tp


def problem(kind, spec: Spec, value, typed: bool) -> str | None:
    """What is wrong with ``value`` ('must be ...', without the key), or None."""
    if value is None:  # an optional key left unset
        return None
    if spec.choices is not None:
        names = spec.names()
        text = str(value.value if isinstance(value, Enum) else value)
        if text in names:
            return None
        if not typed:
            return f"must be one of {', '.join(names)}, got {value!r}"
        listed = list(spec.listed or names)
        allowed = ", ".join(listed[:-1]) + f" or {listed[-1]}" if len(listed) > 1 else listed[0]
        boolean = {"False": "false", "True": "true"}.get(text) if not isinstance(value, bool) else str(value).lower()
        if boolean:  # a YAML boolean, as a str field holds it
            return f"must be {allowed}, got {boolean} (a boolean; write the key={names[0]} or ={names[1]})"
        return f"must be {allowed}, got '{text}'"
    if kind not in (int, float):
        return None
    rng = spec.range_text()
    number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not typed and not number:
        return f"must be a finite number, got {value!r}"
    finite = "a finite number " if typed and kind is float else ""
    if not number:
        return f"must be {finite}{rng}, got {value}".replace(" , got", ", got")
    lo, hi = spec.lo, spec.hi
    if (lo is not None and (value <= lo if spec.lo_open else value < lo)) or \
            (hi is not None and (value >= hi if spec.hi_open else value > hi)):
        return f"must be {finite}{rng}, got {value}"
    if not typed and kind is int and int(value) != value:
        return f"must be a whole number, got {value}"
    if spec.time_base and value * PS_PER_NS >= MAX_PS:
        return (f"must be below {MAX_PS // PS_PER_NS:.0e} ns (the time base ends at 10^15 ps, "
                f"1000 s simulated), got {value:g}")
    return None


def check(values, cls, prefix: str, *, typed: bool = True, error: type = ParamError) -> dict:
    """Check the declared parameters of dataclass ``cls`` present in ``values`` (a mapping:
    a config node or keyword arguments); raise ``error`` naming ``<prefix><name>`` at the
    first one outside its declaration. ``typed``: the values have their fields' types
    already (a composed schema), else they are checked and converted here.

    Returns:
        ``{name: value}`` of the declared parameters present, ints and floats converted to
        their fields' types (a choice as its name).
    """
    out = {}
    for f in dataclasses.fields(cls):  # nested configs (bench.inputs): their own declarations
        if f.name in values and dataclasses.is_dataclass(f.default_factory) and values[f.name] is not None:
            check(values[f.name], f.default_factory, f"{prefix}{f.name}.", typed=typed, error=error)
    needed = {f.name for f in dataclasses.fields(cls)
              if f.default is not None and f.default_factory is dataclasses.MISSING}  # None not allowed
    for name, kind, spec, _ in declared(cls):
        if name not in values:
            continue
        value = values[name]
        bad = problem(kind, spec, value, typed)
        if value is None and name in needed and not typed:  # null where a value is needed
            bad = f"must be {'a finite number' if kind in (int, float) else 'set'}, got null"
        if bad:
            raise error(f"{prefix}{name} {bad}".replace("the key=", f"{prefix}{name}="))
        if isinstance(value, Enum):
            value = value.value
        elif kind in (int, float) and value is not None and not isinstance(value, bool):
            value = kind(value)
        out[name] = value
    return out

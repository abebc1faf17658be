"""``cached_attr``: a read-only attribute of an immutable object, computed on first use.

Like :func:`functools.cached_property`, minus its lock (CPython 3.11 takes a lock on every
first access, which costs more than the small sizes and ranges it would save on the
simulator's hot path). The value is stored in the instance ``__dict__`` (frozen
dataclasses too), so later reads are plain attribute lookups. Use it only for values
that cannot change after the object is built.
"""
from __future__ import annotations


class cached_attr:  # noqa: N801 (reads like the decorator it replaces)
    """Decorate a method ``f(self) -> value``; ``obj.f`` computes it once per object."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner, name) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value

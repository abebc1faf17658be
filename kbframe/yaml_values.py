"""How many values a config stands for, checked before anything builds or resolves them:
a YAML file's aliases expanded (the config files Hydra reads from folders on its search
path, kbframe.cli.hydra_guard; a sweep's files a report tool reads,
kbframe.report.sweep_jobs), and a composed config's interpolations resolved
(kbframe.cli.checks, kbframe.cli.search_space).

A YAML alias (``*a``) repeats the node its anchor (``&a``) names, so a few lines of aliases
of aliases stand for billions of values ("billion laughs"). PyYAML composes the file as a
graph, aliases shared; OmegaConf then builds one node per value of the expansion and takes
about 0.3 ms per value, holding the command in Hydra's composition for hours. The count is
taken on the composed graph, each node's count once, so it costs what the file's text does;
a file over :data:`MAX_YAML_BYTES` is refused unread.

An interpolation (``${a.b}``) does to a composed config what an alias does to a file: ten
keys of ten ``${...}`` each, every one naming the key before it, resolve to ten billion
values, and OmegaConf resolves them one at a time. :func:`resolved_values` counts them on
the unresolved config, each key's count once.
"""
from __future__ import annotations

import re

from .errors import ConfigError

#: values the config files of one composed config may stand for together, aliases expanded
#: (OmegaConf builds them in a few seconds; kbframe's largest config file has under 200)
MAX_YAML_VALUES = 20_000
#: levels of lists and mappings a YAML file may nest (kbframe's own nest under 10)
MAX_YAML_DEPTH = 64
#: bytes of a YAML file read at all (20,000 values of plain YAML take under 400 KB)
MAX_YAML_BYTES = 1 << 20


class YamlRefused(ValueError):
    """A YAML file refused before it is loaded: its one line names the file and why."""


def yaml_values(text: str) -> int | None:
    """The number of values (scalars, sequences, mappings and keys) the YAML ``text`` stands
    for with every alias expanded, counted up to just past :data:`MAX_YAML_VALUES` (a
    recursive alias counts as more than it). None if PyYAML cannot compose the text (Hydra's
    own loading then says why). Raises RecursionError for nesting deeper than
    :data:`MAX_YAML_DEPTH` levels, or too deep for PyYAML to compose."""
    import yaml
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    if root is None:
        return 0
    over = MAX_YAML_VALUES + 1
    counts: dict[int, int] = {}
    on_path: set[int] = set()
    stack = [(root, False)]
    while stack:  # post-order, each node once: an alias is the same node object
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            kids = _children(node)
            counts[key] = min(over, 1 + sum(counts[id(k)] for k in kids))
            continue
        if key in counts:
            continue
        if key in on_path:  # an alias of a node that holds it: endless
            return over
        on_path.add(key)
        if len(on_path) > MAX_YAML_DEPTH:  # OmegaConf recurses per level: Python's stack ends first
            raise RecursionError(f"nested deeper than {MAX_YAML_DEPTH} levels")
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in counts)
    return counts[id(root)]


def _children(node) -> list:
    import yaml
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def read_yaml_text(path) -> str:
    """The text of the YAML file at ``path``, checked: at most :data:`MAX_YAML_BYTES`, UTF-8.

    Raises:
        OSError: the file cannot be read.
        YamlRefused: too large, or not UTF-8 text.
    """
    with open(path, "rb") as f:
        data = f.read(MAX_YAML_BYTES + 1)
    if len(data) > MAX_YAML_BYTES:
        raise YamlRefused(f"config file '{path}' is over {MAX_YAML_BYTES:,} bytes; a config file holds at most that")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise YamlRefused(f"config file '{path}' is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})") \
            from None


def checked_values(text: str, path, before: int = 0) -> int:
    """The values of the YAML ``text`` (of the file ``path``; 0 if PyYAML cannot compose
    it), refused if they and the ``before`` values read already for the same config are
    more than :data:`MAX_YAML_VALUES`.

    Raises:
        YamlRefused: one line naming the file and the limit (or a nesting too deep to parse).
    """
    try:
        n = yaml_values(text)
    except RecursionError:
        raise YamlRefused(f"config file '{path}' nests its lists or mappings deeper than {MAX_YAML_DEPTH} levels") \
            from None
    if n is None:  # the loader's own error names what is wrong
        return 0
    if n > MAX_YAML_VALUES:
        raise YamlRefused(f"config file '{path}': its YAML stands for more than {MAX_YAML_VALUES:,} values with its "
                          f"aliases (*name) expanded; a config holds at most {MAX_YAML_VALUES:,}")
    if before + n > MAX_YAML_VALUES:
        raise YamlRefused(f"config file '{path}': with the config files read before it, the config stands for more "
                          f"than {MAX_YAML_VALUES:,} values (aliases (*name) expanded); a config holds at most "
                          f"{MAX_YAML_VALUES:,}")
    return n


#: an interpolation holding no other (``${a.b}``, ``${oc.env:X}``; the inner one of
#: ``${oc.create:${a}}``). An escaped one (``\${a}``) counts too: ``oc.decode`` resolves it
_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")
#: resolvers whose first argument is a config key, resolving to the node it names
_KEY_RESOLVERS = frozenset({"oc.select", "oc.dict.keys", "oc.dict.values"})
_KEY_PART = re.compile(r"([^.\[\]]+)|\[\s*([^\]]*?)\s*\]")


def resolved_values(root, at: tuple = ()) -> tuple[int, str]:
    """The values (as :func:`yaml_values` counts them) the node at path ``at`` of the
    config ``root`` stands for with its interpolations resolved, counted up to just past
    :data:`MAX_YAML_VALUES`, and the key of the interpolation that stands for the most.
    ``root``: the config as plain containers, unresolved
    (``OmegaConf.to_container(cfg, resolve=False)``). Each ``${key}`` (absolute, or relative:
    ``${.key}``, ``${..key}``; or the key an ``oc.select`` / ``oc.dict`` resolver names)
    counts what the node it names stands for, each key's count taken once; a key that is
    not in ``root`` counts as one value (OmegaConf says why when it resolves it)."""
    return _Resolved(root).count(at)


def check_resolved(root, at: tuple = (), what: str = "the config") -> None:
    """:func:`resolved_values` of the node at ``at`` of ``root``, refused over
    :data:`MAX_YAML_VALUES` before OmegaConf resolves it.

    Raises:
        ConfigError: one line naming the interpolation's key and the limit.
    """
    n, key = resolved_values(root, at)
    if n > MAX_YAML_VALUES:
        raise ConfigError(f"{key or _dotted(at) or 'config'}: its interpolations (${{...}}) resolve "
                          f"{what} to more than {MAX_YAML_VALUES:,} values; a config holds at most "
                          f"{MAX_YAML_VALUES:,}")


class _Resolved:
    """:func:`resolved_values`: counts memoised by a node's path in ``root``."""

    def __init__(self, root):
        self.root = root
        self.counts: dict[tuple, int] = {}
        self.busy: set[tuple] = set()
        self.largest = (0, "")

    def count(self, at: tuple) -> tuple[int, str]:
        found = self._node(at)
        if found is None:
            return 0, ""
        try:
            n = self._count(*found)
        except RecursionError:  # a chain of keys naming keys deeper than Python's stack
            return MAX_YAML_VALUES + 1, self.largest[1]
        return n, self.largest[1]

    def _count(self, path: tuple, node) -> int:
        if path in self.counts:
            return self.counts[path]
        if path in self.busy:  # a cycle: OmegaConf names it when it resolves it
            return 1
        self.busy.add(path)
        over = MAX_YAML_VALUES + 1
        if isinstance(node, dict):
            n = 1
            for k, v in node.items():
                n = min(over, n + 1 + self._count(path + (k,), v))
        elif isinstance(node, list):
            n = 1
            for i, v in enumerate(node):
                n = min(over, n + self._count(path + (i,), v))
        elif isinstance(node, str) and "${" in node:
            n = 1
            for key in _referenced(node):
                found = self._node(_key_path(path[:-1], key))
                if found is not None:
                    n = min(over, n + self._count(*found))
            if n > self.largest[0]:
                self.largest = (n, _dotted(path))
        else:
            n = 1
        self.busy.discard(path)
        self.counts[path] = n
        return n

    def _node(self, path: tuple | None, hops: int = 0):
        """``(path, node)``: the node at ``path``, interpolations on the way followed (a
        node that is one ``${key}`` stands for the node ``key`` names); None if none."""
        if path is None or hops > MAX_YAML_DEPTH:
            return None
        node, here = self.root, ()
        for part in path:
            found = self._follow(here, node, hops)
            if found is None:
                return None
            here, node = found
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, dict) and str(part) in node:
                part = str(part)
                node = node[part]
            elif isinstance(node, list) and str(part).lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
                part = int(part) % len(node)
                node = node[part]
            else:
                return None
            here = here + (part,)
        return self._follow(here, node, hops)

    def _follow(self, here: tuple, node, hops: int):
        if isinstance(node, str) and node.startswith("${") and node.endswith("}"):
            keys = _referenced(node)
            if len(keys) == 1 and _INTERPOLATION.fullmatch(node):
                return self._node(_key_path(here[:-1], keys[0]), hops + 1) or (here, node)
        return here, node


def _referenced(text: str) -> list[str]:
    """The config keys the interpolations in ``text`` name."""
    keys = []
    for m in _INTERPOLATION.finditer(text):
        body = m.group(1).strip()
        name, colon, args = body.partition(":")
        if not colon:
            keys.append(body)
        elif name.strip() in _KEY_RESOLVERS:
            keys.append(args.split(",")[0].strip().strip("'\""))
    return keys


def _key_path(parent: tuple, key: str) -> tuple | None:
    """The path of ``key`` as an interpolation in the node at ``parent`` names it
    (``.key`` from ``parent``, ``..key`` from its parent); None if it leaves the config."""
    dots = len(key) - len(key.lstrip("."))
    if dots:
        up = dots - 1
        if up > len(parent):
            return None
        start = parent[:len(parent) - up]
    else:
        start = ()
    parts = tuple(name or index for name, index in _KEY_PART.findall(key[dots:]))
    return start + parts


def _dotted(path: tuple) -> str:
    """``('a', 'b', 0)`` → ``a.b[0]``, as errors name a key."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")

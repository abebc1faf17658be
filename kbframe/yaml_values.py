"""How many values a config stands for, checked before anything builds or resolves them:
a YAML file's aliases expanded (the config files Hydra reads from folders on its search
path, kbframe.cli.hydra_guard; a sweep's files a report tool reads,
kbframe.report.sweep_jobs), and a composed config's interpolations resolved (Hydra's own
section and what Hydra resolves as it composes, kbframe.cli.hydra_guard; each run,
kbframe.cli.checks; a sweep, kbframe.cli.search_space; a report's files).

A YAML alias (``*a``) repeats the node its anchor (``&a``) names, so a few lines of aliases
of aliases stand for billions of values ("billion laughs"). PyYAML composes the file as a
graph, aliases shared; OmegaConf then builds one node per value of the expansion and takes
about 0.3 ms per value, holding the command in Hydra's composition for hours. The count is
taken on the composed graph, each node's count once, so it costs what the file's text does;
a file over :data:`MAX_YAML_BYTES` is refused unread.

An interpolation (``${a.b}``) does to a composed config what an alias does to a file: ten
keys of ten ``${...}`` each, every one naming the key before it, resolve to ten billion
values, and OmegaConf resolves them one at a time; a key or a resolver's argument may be
computed as it resolves, so no count on the unresolved config can follow them all.
:func:`check_resolves` resolves the config once with OmegaConf itself, counting what it
spends (values, steps of resolution, characters), and stops at the first limit.
"""
from __future__ import annotations

from contextlib import contextmanager

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


#: steps OmegaConf's resolution may take while one check runs: a node's ``${key}``, a
#: resolver's call, each value a resolver builds, and each 200 characters of a parsed
#: string (parsing one costs about what resolving a key does); kbframe's own configs take
#: a few dozen
MAX_RESOLUTIONS = 20_000
#: characters of one string an interpolation resolves to (what a config file may hold)
MAX_RESOLVED_CHARS = MAX_YAML_BYTES
#: characters of all the strings of one config, resolved
MAX_RESOLVED_TOTAL_CHARS = 8 * MAX_YAML_BYTES
_CHARS_PER_STEP = 200


class _Budget:
    """What OmegaConf's resolutions under :func:`check_resolves` or :func:`composition_budget` may
    still spend."""

    #: the budget of the check running now; None: resolutions are not counted
    active: _Budget | None = None

    def __init__(self) -> None:
        self.resolutions = 0
        self.over: str | None = None  # why the budget is spent: every later resolution stops at once

    def spend(self, steps: int = 1) -> None:
        self.resolutions += steps
        if self.resolutions > MAX_RESOLUTIONS and self.over is None:
            self.over = "steps"
        if self.over is not None:
            raise _Spent(self.over)

    def check_text(self, value) -> None:
        if isinstance(value, str) and len(value) > MAX_RESOLVED_CHARS and self.over is None:
            self.over = "chars"
        if self.over is not None:
            raise _Spent(self.over)


class _Spent(Exception):
    """Raised inside OmegaConf's resolution once the budget is spent. OmegaConf may wrap it
    in an error of its own, so :func:`check_resolves` reads the budget, not the exception."""


def _install() -> None:
    """Count OmegaConf's resolutions while a check runs (idempotent; kbframe.internals)."""
    from .internals import omegaconf_container_class
    container = omegaconf_container_class()
    if getattr(container.resolve_parse_tree, "__kbframe_budget__", False):
        return
    node, resolver, tree = (container._resolve_node_interpolation, container._evaluate_custom_resolver,
                            container.resolve_parse_tree)

    def counted_node(self, *args, **kwargs):
        if _Budget.active is not None:
            _Budget.active.spend()
        return node(self, *args, **kwargs)

    def counted_resolver(self, *args, **kwargs):
        budget = _Budget.active
        if budget is None:
            return resolver(self, *args, **kwargs)
        budget.spend()
        if kwargs.get("inter_type") == "oc.create":  # YAML text: its aliases expand as it is built
            for arg in kwargs.get("inter_args") or ():
                if isinstance(arg, str):
                    budget.spend(_created_values(arg))
        value = resolver(self, *args, **kwargs)
        if hasattr(value, "__len__") and not isinstance(value, str):  # each value a resolver built
            budget.spend(len(value))
        return value

    def counted_tree(self, *args, **kwargs):
        budget = _Budget.active
        if budget is None:
            return tree(self, *args, **kwargs)
        parse_tree = kwargs.get("parse_tree", args[0] if args else None)
        budget.spend(1 + len(parse_tree.getText()) // _CHARS_PER_STEP if parse_tree is not None else 1)
        value = tree(self, *args, **kwargs)
        budget.check_text(value)
        return value
    counted_tree.__kbframe_budget__ = True
    container._resolve_node_interpolation = counted_node
    container._evaluate_custom_resolver = counted_resolver
    container.resolve_parse_tree = counted_tree


def _created_values(text: str) -> int:
    """The values ``oc.create`` builds from the YAML ``text``, aliases expanded (past the
    limit: too deep or recursive)."""
    try:
        n = yaml_values(text)
    except RecursionError:
        return MAX_RESOLUTIONS + 1
    return n or 1


@contextmanager
def _counted(message):
    """Count OmegaConf's resolutions inside the block (:class:`_Budget`, yielded); when the
    budget runs out, raise ConfigError with ``message(why)``, whatever OmegaConf or Hydra
    made of the stop inside."""
    _install()
    budget = _Budget()
    previous, _Budget.active = _Budget.active, budget
    try:
        yield budget
        if budget.over is not None:  # the stop was swallowed inside
            raise _Spent(budget.over)
    except Exception:  # noqa: BLE001 (_Spent, or an error wrapping it)
        if budget.over is None:
            raise
        raise ConfigError(message(budget.over)) from None
    finally:
        _Budget.active = previous


def composition_budget():
    """Count the resolutions Hydra makes while it composes a config (it resolves some keys
    of its own section, ``hydra.job.env_copy`` and ``override_dirname``'s, before any check).

    Raises:
        ConfigError: one line when the budget ran out.
    """
    return _counted(lambda why: (
        f"composing the config, Hydra's resolving of its interpolations (${{...}}) takes more than "
        f"{MAX_RESOLUTIONS:,} steps; a config may take at most {MAX_RESOLUTIONS:,}" if why == "steps"
        else _spent_message("hydra", why)))


def check_resolves(cfg, at: str = "", skip: tuple = ()) -> None:
    """Resolve every value of the OmegaConf config ``cfg`` (named ``at`` in messages) once,
    as ``OmegaConf.to_container(resolve=True)`` would, within budgets, so that a caller
    resolves it in bounded time and memory: at most :data:`MAX_YAML_VALUES` values (an
    interpolation of a list or mapping counts each of its values again),
    :data:`MAX_RESOLUTIONS` steps (a computed key, a resolver's call, each value it builds
    and a string's parse each count), strings of :data:`MAX_RESOLVED_CHARS` characters and
    :data:`MAX_RESOLVED_TOTAL_CHARS` in all. A value that does not
    resolve is left to the caller's own resolution, which names it; ``skip``: keys not
    read (text no one resolves).

    Raises:
        ConfigError: one line naming the key being resolved when a budget ran out.
    """
    from omegaconf import DictConfig, ListConfig

    def children(key: str, node) -> list:
        if isinstance(node, DictConfig):
            return [(f"{key}.{k}" if key else str(k), node, k) for k in node.keys()]
        if isinstance(node, ListConfig):
            return [(f"{key}[{i}]", node, i) for i in range(len(node))]
        return []

    values, chars, key = 0, 0, at
    with _counted(lambda why: _spent_message(key, why)) as budget:
        stack = children(at, cfg)[::-1]
        while stack:
            key, parent, k = stack.pop()
            if key in skip:
                continue
            values += 1
            if values > MAX_YAML_VALUES:
                budget.over = "values"
                raise _Spent(budget.over)
            try:
                value = parent[k]
            except Exception:  # noqa: BLE001 (the caller's resolution names what does not resolve)
                if budget.over is not None:
                    raise
                continue
            if isinstance(value, str):
                chars += len(value)
                if chars > MAX_RESOLVED_TOTAL_CHARS:
                    budget.over = "total"
                    raise _Spent(budget.over)
            stack.extend(children(key, value)[::-1])


def container_values(node) -> int:
    """The values (as :func:`yaml_values` counts them) of ``node``, plain dicts and lists
    (``OmegaConf.to_container(cfg, resolve=False)``): interpolations not resolved."""
    n, stack = 0, [node]
    while stack:
        x = stack.pop()
        n += 1
        if isinstance(x, dict):
            n += len(x)
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return n


def _spent_message(key: str, why: str) -> str:
    if why == "values":
        return (f"{key}: the config's interpolations (${{...}}) resolve to more than {MAX_YAML_VALUES:,} values "
                f"by here; a config holds at most {MAX_YAML_VALUES:,}")
    if why == "steps":
        return (f"{key}: resolving the config's interpolations (${{...}}) takes more than {MAX_RESOLUTIONS:,} "
                f"steps by here; a config may take at most {MAX_RESOLUTIONS:,}")
    if why == "total":
        return (f"{key}: the config's strings resolve to more than {MAX_RESOLVED_TOTAL_CHARS:,} characters in all "
                f"by here; a config's strings hold at most that many")
    return (f"{key}: an interpolation (${{...}}) resolves to a string of more than {MAX_RESOLVED_CHARS:,} "
            f"characters; a config's strings hold at most that many")

"""How many values a YAML file stands for, its aliases expanded: checked before OmegaConf
builds a node for each of them (the config files Hydra reads from folders on its search
path, kbframe.cli.hydra_guard; a sweep's files a report tool reads, kbframe.report.sweep_jobs).

A YAML alias (``*a``) repeats the node its anchor (``&a``) names, so a few lines of aliases
of aliases stand for billions of values ("billion laughs"). PyYAML composes the file as a
graph, aliases shared; OmegaConf then builds one node per value of the expansion and takes
about 0.3 ms per value, holding the command in Hydra's composition for hours. The count is
taken on the composed graph, each node's count once, so it costs what the file's text does;
a file over :data:`MAX_YAML_BYTES` is refused unread.
"""
from __future__ import annotations

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

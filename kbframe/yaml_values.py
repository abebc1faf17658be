"""How many values a YAML file stands for, its aliases expanded: checked before OmegaConf
builds a node for each of them (a config file Hydra reads from a folder on its search path,
kbframe.cli.hydra_guard; a sweep's files a report tool reads).

A YAML alias (``*a``) repeats the node its anchor (``&a``) names, so a few lines of aliases
of aliases stand for billions of values ("billion laughs"). PyYAML composes the file as a
graph, aliases shared; OmegaConf then builds one node per value of the expansion and takes
about 0.3 ms per value, holding the command in Hydra's composition for hours. The count is
taken on the composed graph, each node's count once, so it costs what the file's text does.
"""
from __future__ import annotations

#: values a config file may stand for, its aliases expanded (OmegaConf builds them in about
#: 30 s; kbframe's largest config file has under 200)
MAX_YAML_VALUES = 100_000


def yaml_values(text: str) -> int | None:
    """The number of values (scalars, sequences, mappings and keys) the YAML ``text`` stands
    for with every alias expanded, counted up to just past :data:`MAX_YAML_VALUES` (a
    recursive alias counts as more than it). None if PyYAML cannot compose the text (Hydra's
    own loading then says why)."""
    import yaml
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
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


class TooManyValues(ValueError):
    """A YAML file that stands for more than :data:`MAX_YAML_VALUES` values."""


def check_yaml_values(path) -> None:
    """Refuse the YAML file at ``path`` if it stands for more than :data:`MAX_YAML_VALUES`
    values, its aliases expanded; a file that cannot be read or composed is left to its
    reader's own error.

    Raises:
        TooManyValues: one line naming the file and the limit.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return
    n = yaml_values(text)
    if n is not None and n > MAX_YAML_VALUES:
        raise TooManyValues(f"config file '{path}': its YAML stands for more than {MAX_YAML_VALUES:,} values with "
                            f"its aliases (*name) expanded; a config file holds at most {MAX_YAML_VALUES:,}")


def load_yaml(path):
    """``OmegaConf.load(path)`` after :func:`check_yaml_values` (a file in a directory
    handed to a report tool may be anyone's).

    Raises:
        TooManyValues: as :func:`check_yaml_values`; and what OmegaConf.load raises.
    """
    from omegaconf import OmegaConf
    check_yaml_values(path)
    return OmegaConf.load(path)

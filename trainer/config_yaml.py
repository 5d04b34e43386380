"""The YAML a config comes in: a file given with ``--config``, or a ``--set`` value. Loaded
safely, with each key once per mapping, and bounded: a value nesting deeper than
:data:`MAX_DEPTH` or expanding to more than :data:`MAX_VALUES` (aliases repeated inside each
other) is one :class:`~trainer.errors.ConfigError` line, never a RecursionError or gigabytes
of memory."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from trainer.errors import ConfigError, missing

MAX_VALUES = 1_000_000
"""Most values (scalars, lists and mappings, each alias counted where it is used) a config
layer may hold: nine lines of YAML aliases expand to 387 million (a "billion laughs"), which
grew `run`'s launcher to 3.4 GB as it passed the config to its ranks."""


def too_many(source: str) -> ConfigError:
    return ConfigError(f"{source} expands to more than {MAX_VALUES:,} values (YAML aliases "
                       "repeated inside each other)",
                       "write the values out; a config needs far fewer")


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (PyYAML
    keeps the last one silently). A merge key (``<<: *defaults``) is not a key of its own: its
    keys are merged as YAML 1.1 does, the mapping's own keys winning over them."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # SafeConstructor.flatten_mapping merges it
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            try:
                seen.add(key)
            except TypeError:  # `{{}: 1}`: PyYAML's own check comes after this one
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping or list used as a key", key_node.start_mark) from None
        return super().construct_mapping(node, deep)


# YAML 1.2's floats, which PyYAML (YAML 1.1) reads as strings when they have an exponent and no
# dot: `1e-05` is how Helm's toYaml writes `lr: 0.00001` from a chart's values, and how Python
# and JSON print small numbers.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and where (PyYAML's own text spans lines)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{exc.problem}{where}"
    return " ".join(str(exc).split())


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    fix = "pass a readable UTF-8 YAML file to --config"
    if str(path) == "":
        raise ConfigError("--config '' names no file", "pass a YAML file, or leave --config out")
    if p.is_dir():
        raise ConfigError(f"config file {p} is a directory", fix)
    if not p.exists():
        why, missing_fix = missing(p, "pass an existing file to --config")
        raise ConfigError(f"config file {p} {why}", missing_fix)
    if not p.is_file():
        raise ConfigError(f"config file {p} is not a regular file (a device, pipe or socket)",
                          fix)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {p} cannot be read ({exc.strerror})", fix) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte "
                          f"0x{exc.object[exc.start]:02x} at offset {exc.start})",
                          "save it as UTF-8") from None
    try:
        loaded = parse(text, f"config file {p}")
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {yaml_problem(exc)}",
                          "fix the YAML there (each key once per mapping)") from None
    return loaded or {}


MAX_DEPTH = 100
"""Deepest nesting of lists and mappings a config value may have: PyYAML's loader, and the
copies and dumps of the config after it, recurse once per level (3000 levels raised
RecursionError)."""


def parse(text: str, where: str) -> Any:
    """`text` loaded with the unique-key loader; ConfigError, naming `where`, when it nests
    deeper than :data:`MAX_DEPTH`."""
    try:
        loaded = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except RecursionError:
        loaded = None
    else:
        stack, deepest, seen = [(loaded, 0)], 0, 0
        while stack and deepest <= MAX_DEPTH:  # not recursive: the value may be that deep
            value, depth = stack.pop()
            seen += 1
            if seen > MAX_VALUES:  # a billion laughs: 387 million values to walk
                raise too_many(where)
            deepest = max(deepest, depth)
            children = value.values() if isinstance(value, dict) else value if isinstance(
                value, list) else ()
            stack.extend((child, depth + 1) for child in children)
        if deepest <= MAX_DEPTH:
            return loaded
    raise ConfigError(f"{where} nests lists or mappings more than {MAX_DEPTH} levels deep",
                      "flatten it: no config value needs that many levels")

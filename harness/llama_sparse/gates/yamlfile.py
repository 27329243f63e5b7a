"""Gate files as YAML: every mapping remembers its lines, a duplicate key is an error, and a
syntax error names the file, line and column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from llama_sparse.errors import UserError


class SpecError(UserError):
    """A gate file that cannot be used; the message names the file (and line) of every problem."""


class Map(dict):
    """A YAML mapping that remembers on which line it and each of its keys stand."""

    line: int = 0
    lines: dict[Any, int]


class Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: Loader, node: yaml.MappingNode) -> Map:
    loader.flatten_mapping(node)
    result = Map()
    result.line = node.start_mark.line + 1
    result.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark) from None
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {result.lines[key]})",
                key_node.start_mark)
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = key_node.start_mark.line + 1
    return result


Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def shown_path(path: Path) -> str:
    """The path as the user would type it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def read_yaml(path: Path, shown: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{shown}: cannot read gate file ({e})") from e
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 -- a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
        what = e.problem or "invalid YAML"
        context = ""
        if e.context and e.problem:
            started = e.context_mark
            on = f" on line {started.line + 1}" if started and (not mark or started.line != mark.line) else ""
            context = f" ({e.context}{' started' if on else ''}{on})"
        raise SpecError(f"{where}: YAML error: {what}{context}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{shown}: YAML error: {e}") from None


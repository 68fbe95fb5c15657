"""What log rule files and metric rule files share: reading the YAML with the line of every node, and
field checks whose RuleError names the file, the line of the offending key and the rule.

`yaml.safe_load` forgets where things were and silently keeps the last of two equal keys, so a rule file
is read as a node tree first; every error can then point at the line a person has to fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from core.errors import RuleError

RULE_FILE_SUFFIXES = (".yaml", ".yml")
REASON_RE = re.compile(r"[A-Z][A-Za-z0-9]*")

E = TypeVar("E", bound=Enum)


def rule_files_in(directory: Path, kind: str) -> list[Path]:
    """The *.yaml / *.yml files of a rules folder, sorted; `kind` ("rule", "metric rule") names them in errors."""
    if not directory.is_dir():
        raise RuleError(
            f"{kind}s folder {directory} does not exist or is not a folder",
            hint=f"pass an existing folder holding *.yaml {kind} files",
        )
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in RULE_FILE_SUFFIXES)


def rule_paths(builtin_dir: Path, extra_dirs: Iterable[Path], kind: str) -> list[Path]:
    """The rule files of the built-in folder, then those of each extra folder."""
    paths = rule_files_in(builtin_dir, kind)
    for directory in extra_dirs:
        paths.extend(rule_files_in(Path(directory), kind))
    return paths


def line_of(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def key_lines(path: Path, node: yaml.MappingNode) -> dict[Any, int]:
    """Line of every key; PyYAML silently keeps the last of duplicate keys, so they are refused here."""
    lines: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node)
        if key in lines:
            raise RuleError(
                f"{path}:{line_of(key_node)}: key '{key}' appears twice (first at line {lines[key]})",
                hint="remove one of them",
            )
        lines[key] = line_of(key_node)
    return lines


def value_node(node: yaml.MappingNode, key: str) -> yaml.Node | None:
    return next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)


def enum_value(kind: type[E], value: Any) -> E | None:
    try:
        return kind(value)
    except ValueError:
        return None


def read_yaml(path: Path, *, kind: str, empty_hint: str) -> tuple[yaml.Node, Any]:
    """The document's node tree and its Python value; `kind` ("rule", "metric rule") names the file in errors."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}: cannot read {kind} file: {exc}", hint="check the path and permissions") from exc
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise RuleError(
            f"{path}:{line}: not valid YAML: {exc.problem or exc}", hint="fix the YAML syntax at that line"
        ) from exc
    except yaml.YAMLError as exc:
        raise RuleError(f"{path}:1: not valid YAML: {exc}", hint="fix the YAML syntax") from exc
    if node is None:
        raise RuleError(f"{path}:1: {kind} file is empty", hint=empty_hint)
    return node, data


def _allowed_hint(allowed: set[str], unknown: Any, misplaced: Mapping[str, str] | None) -> str:
    return f"allowed: {', '.join(sorted(allowed))}" + (misplaced or {}).get(unknown, "")


@dataclass(frozen=True)
class RuleFile:
    """A rule file's top-level mapping with the line of each key; `rules` is a non-empty list."""

    path: Path
    node: yaml.MappingNode
    data: dict[Any, Any]
    keys: dict[Any, int]

    @classmethod
    def read(
        cls,
        path: Path,
        *,
        kind: str,
        empty_hint: str,
        shape: str,
        shape_hint: str,
        allowed: set[str],
        misplaced: Mapping[str, str] | None = None,
    ) -> RuleFile:
        """Read and check the top level. `shape` says what the mapping holds; `misplaced` adds to the hint
        for an unknown key that belongs in another kind of file."""
        node, data = read_yaml(path, kind=kind, empty_hint=empty_hint)
        if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
            raise RuleError(f"{path}:{line_of(node)}: a {kind} file must be a mapping with {shape}", hint=shape_hint)
        keys = key_lines(path, node)
        unknown = sorted(set(data) - allowed, key=str)
        if unknown:
            raise RuleError(
                f"{path}:{keys[unknown[0]]}: unknown key '{unknown[0]}' at file level",
                hint=_allowed_hint(allowed, unknown[0], misplaced),
            )
        return cls(path, node, data, keys)

    @property
    def line(self) -> int:
        return line_of(self.node)

    def require(self, key: str, hint: str) -> None:
        if key not in self.data:
            raise RuleError(f"{self.path}:{self.line}: missing `{key}` at file level", hint=hint)

    def rule_items(self) -> list[tuple[yaml.Node, Any]]:
        """(node, value) of every entry of `rules`."""
        rules, rules_node = self.data["rules"], value_node(self.node, "rules")
        at = f"{self.path}:{self.keys['rules']}"
        if not isinstance(rules, list) or not isinstance(rules_node, yaml.SequenceNode):
            raise RuleError(f"{at}: `rules` must be a list of rules", hint="start each rule with `- `")
        if not rules:
            raise RuleError(f"{at}: `rules` is empty", hint="add rules or delete the file")
        return list(zip(rules_node.value, rules, strict=True))


class RuleItem:
    """One rule's mapping. `fail` builds the error for a field: at that field's line, naming the rule."""

    def __init__(self, path: Path, node: yaml.Node, item: Any, *, kind: str, hint: str) -> None:
        self.path = path
        self.line = line_of(node)
        self.kind = kind
        if not isinstance(item, dict) or not isinstance(node, yaml.MappingNode):
            raise RuleError(f"{path}:{self.line}: a {kind} must be a mapping", hint=hint)
        self.data: dict[Any, Any] = item
        self.keys = key_lines(path, node)

    def fail(self, key: str | None, what: str, hint: str) -> RuleError:
        line = self.keys.get(key, self.line) if key else self.line
        name = self.data.get("reason")
        label = f" (rule {name})" if isinstance(name, str) else ""
        return RuleError(f"{self.path}:{line}{label}: {what}", hint=hint)

    def check_keys(
        self, required: Sequence[str], optional: Sequence[str], misplaced: Mapping[str, str] | None = None
    ) -> None:
        """No unknown key, and every required one present and not empty."""
        allowed = set(required) | set(optional)
        unknown = sorted((k for k in self.data if k not in allowed), key=str)
        if unknown:
            raise self.fail(unknown[0], f"unknown key '{unknown[0]}'", _allowed_hint(allowed, unknown[0], misplaced))
        for key in required:
            if key not in self.data or self.data[key] in (None, ""):
                needs = f"every {self.kind} needs {', '.join(required)}"
                raise self.fail(None, f"missing required field '{key}'", needs)

    def reason(self, example: str) -> str:
        reason = self.data["reason"]
        if not isinstance(reason, str) or not REASON_RE.fullmatch(reason):
            raise self.fail("reason", f"reason {reason!r} is not a CamelCase name", f"e.g. {example}")
        return reason

    def choice(self, key: str, kind: type[E]) -> E:
        """The field as a member of `kind`; the error lists the allowed values."""
        value = enum_value(kind, self.data[key])
        if value is None:
            allowed = ", ".join(m.value for m in kind)
            raise self.fail(key, f"unknown {key} {self.data[key]!r}", f"allowed: {allowed}")
        return value

    def confidence(self, default: float) -> float:
        confidence = self.data.get("confidence", default)
        if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
            raise self.fail("confidence", f"confidence {confidence!r} is not a number from 0 to 1", "e.g. 0.9")
        return float(confidence)

    def text(self, key: str, hint: str) -> str | None:
        """An optional text field (a required one is present once `check_keys` passed)."""
        value = self.data.get(key)
        if value is not None and not isinstance(value, str):
            raise self.fail(key, f"{key} must be text", hint)
        return value

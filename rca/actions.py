"""The catalog of recommended actions (rca/actions.yaml): data, like the detection rules.

Per category, entries with an id and a text, optionally only for some rule or finding reasons. The deterministic
report lists the verdict's category's entries after the deciding rule's own action; the LLM is shown their ids and
may choose and order them, never add its own: a next step of the LLM's that is not an id of the catalog is left
out, and the report says so. Checked at load: every category has at least one entry, no key or id is unknown
or repeated; an error names the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from core.types import Category

CATALOG = Path(__file__).parent / "actions.yaml"


class CatalogError(ValueError):
    pass


@dataclass(frozen=True)
class CatalogAction:
    id: str
    text: str
    reasons: tuple[str, ...] = ()  # empty: for every reason of its category


@dataclass(frozen=True)
class Chosen:
    """The actions a report recommends from the catalog, and the LLM's next steps that were not ids of it."""

    actions: tuple[CatalogAction, ...]
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class ActionCatalog:
    by_category: dict[Category, tuple[CatalogAction, ...]]

    def for_verdict(self, category: Category, reason: str | None = None) -> tuple[CatalogAction, ...]:
        """The entries for `category`: those made for `reason` first, then the category's general ones."""
        entries = self.by_category.get(category, ())
        specific = [a for a in entries if reason is not None and reason in a.reasons]
        general = [a for a in entries if not a.reasons]
        return tuple(specific + general)

    def choose(self, category: Category, reason: str | None, llm_steps: list[str] | None = None) -> Chosen:
        """The catalog's actions for the verdict, in the LLM's order where it chose some by id (else the catalog's);
        what the LLM wrote that is no id of these is refused."""
        offered = {a.id: a for a in self.for_verdict(category, reason)}
        if not llm_steps:
            return Chosen(tuple(offered.values()))
        picked = [offered[s.strip()] for s in dict.fromkeys(llm_steps) if s.strip() in offered]
        refused = tuple(s for s in llm_steps if s.strip() not in offered)
        return Chosen(tuple(picked) or tuple(offered.values()), refused)


def load_catalog(path: Path = CATALOG) -> ActionCatalog:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"{path}: cannot read the action catalog: {exc}") from exc
    if not isinstance(raw, dict):
        raise CatalogError(f"{path}: the action catalog must map categories to lists of actions")
    known = {c.value: c for c in Category}
    seen: set[str] = set()
    by_category: dict[Category, tuple[CatalogAction, ...]] = {}
    for key, entries in raw.items():
        if key not in known:
            raise CatalogError(f"{path}: key {key!r} is not a category (known: {', '.join(known)})")
        if not isinstance(entries, list) or not entries:
            raise CatalogError(f"{path}: key {key!r} needs a list of at least one action")
        actions = []
        for i, entry in enumerate(entries):
            action = _entry(path, f"{key}[{i}]", entry)
            if action.id in seen:
                raise CatalogError(f"{path}: key {key}[{i}]: the id {action.id!r} is used twice")
            seen.add(action.id)
            actions.append(action)
        by_category[known[key]] = tuple(actions)
    missing = [c.value for c in Category if c not in by_category]
    if missing:
        raise CatalogError(f"{path}: no actions for the categories {', '.join(missing)}")
    return ActionCatalog(by_category)


def _entry(path: Path, where: str, entry: Any) -> CatalogAction:
    if not isinstance(entry, dict) or set(entry) - {"id", "text", "reasons"}:
        raise CatalogError(f"{path}: key {where}: an action has exactly id, text and optionally reasons")
    ident, text, reasons = entry.get("id"), entry.get("text"), entry.get("reasons", [])
    if not isinstance(ident, str) or not ident.strip() or not isinstance(text, str) or not text.strip():
        raise CatalogError(f"{path}: key {where}: id and text must be non-empty strings")
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        raise CatalogError(f"{path}: key {where}: reasons must be a list of rule or finding reasons")
    return CatalogAction(id=ident.strip(), text=text.strip(), reasons=tuple(reasons))

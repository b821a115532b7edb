"""The package's folders are its layers (docs/architecture.md): each imports only the
layers below it, and no more than 10 modules sit loose at the package root."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "oaipmh_dagster"
# Top to bottom: a room may import the rooms after it, never one before it.
LAYERS = ["cli", "definitions", "defs", "operations", "serve", "harvesting", "storage",
          "transform", "oai", "demo", "formats", "fields", "contracts", "words", "stopping", "errors",
          "__init__"]


def _room(module: str) -> str:
    """`oaipmh_dagster.harvesting.plan` -> `harvesting`; the package itself (and a
    name imported from it, `__version__`) -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "__init__"


def _imports(path: Path) -> set[str]:
    """The package modules `path` imports (absolute imports; relative ones stay inside)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "oaipmh_dagster":
                found |= {f"oaipmh_dagster.{a.name}" for a in node.names}
            elif node.module.startswith("oaipmh_dagster."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("oaipmh_dagster")}
    return found


def test_every_room_is_a_known_layer() -> None:
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert rooms == set(LAYERS)


def test_no_import_runs_upward() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        here = rel.parts[0].removesuffix(".py")
        for target in _imports(path):
            there = _room(target)
            if there != here and LAYERS.index(there) < LAYERS.index(here):
                upward.append(f"{rel} imports {target}")
    assert upward == []


def test_at_most_ten_modules_at_the_root() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 10, loose

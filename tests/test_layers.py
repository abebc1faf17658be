"""Folder rules of the package (DESIGN.md, layers): imports flow one way, down the layers.

Order, top to bottom: cli → run → (report, workloads) → kernels → tl → sim → hw → ir →
foundation (errors, timebase, files, yaml_values, params, records: the run's record table,
with record_fields and periodic_form, which report/ reads too). A module may import its own folder
and any folder below it; ``report/`` reads files, record tables and metrics only, so it
imports no simulation layer.
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "kbframe"

# folder -> folders it may import (besides itself and the foundation modules)
ALLOWED = {
    "ir": set(),
    "hw": {"ir"},
    "sim": {"hw", "ir"},
    "tl": {"ir"},
    "kernels": set(),
    "workloads": {"kernels", "ir"},
    "report": set(),
    "run": {"workloads", "kernels", "report", "tl", "sim", "hw", "ir"},
    "cli": {"run", "report", "workloads", "tl", "sim", "hw", "ir"},
}
FOUNDATION = {"errors", "timebase", "files", "yaml_values", "internals", "params", "records", "record_fields", "periodic_form",
              "repeated", "sorting"}


def _imports(path: Path) -> set[str]:
    """Top-level kbframe folders/modules that ``path`` imports."""
    tree = ast.parse(path.read_text())
    rel = path.relative_to(PKG).with_suffix("").parts
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel[:-1])[: len(rel) - node.level]
                mod = base + (node.module.split(".") if node.module else [])
                if not mod:  # from . import x at the package root
                    mod = [a.name for a in node.names][:1]
            elif node.module and node.module.startswith("kbframe"):
                mod = node.module.split(".")[1:] or [a.name for a in node.names][:1]
            else:
                continue
            found.add(mod[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("kbframe."):
                    found.add(a.name.split(".")[1])
    return found


def test_imports_flow_down_the_layers():
    bad = []
    for folder, allowed in ALLOWED.items():
        for path in sorted((PKG / folder).rglob("*.py")):
            for dep in _imports(path) - {folder} - FOUNDATION:
                if dep not in allowed:
                    bad.append(f"{path.relative_to(PKG)} imports {dep}")
    assert bad == []


def test_every_module_is_in_a_layer_folder():
    loose = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in FOUNDATION | {"__init__", "__main__"})
    assert loose == []


def test_hw_never_imports_tl_or_recipe_code():
    """ADR-0065 D6.5: PE_SCHEDULER reads flat ops; no hw module imports the tl layer."""
    for path in sorted((PKG / "hw").rglob("*.py")):
        assert "tl" not in _imports(path), path
        imports = [ln for ln in path.read_text().splitlines() if ln.startswith(("from ", "import "))]
        assert not any("recipe" in ln or "lowering" in ln for ln in imports), path

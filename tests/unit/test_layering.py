"""Imports flow one way (docs/architecture.md). Parsed statically with ast, so the test also covers lazy imports."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "tidal"

# layer -> tidal layers it may import (itself always allowed)
ALLOWED = {
    "core": set(),
    "costmodel": {"core"},
    "planner": {"core", "costmodel"},
    "simulator": {"core", "costmodel", "planner"},
    "data": {"core"},
    "models": {"core"},
    "runtime": {"core", "costmodel", "planner", "models", "data"},
    "cli": {"core", "costmodel", "planner", "simulator", "data", "models", "runtime"},
}
NO_TORCH = {"core", "costmodel", "planner", "simulator"}
NO_DIST = NO_TORCH | {"models", "data"}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def _files():
    for layer in ALLOWED:
        for f in sorted((SRC / layer).rglob("*.py")) if (SRC / layer).exists() else []:
            yield layer, f


@pytest.mark.unit
@pytest.mark.parametrize("layer,path", list(_files()), ids=lambda x: str(x).split("src/tidal/")[-1])
def test_imports_flow_one_way(layer, path):
    for mod in _imports(path):
        parts = mod.split(".")
        if parts[0] == "tidal" and len(parts) > 1 and parts[1] in ALLOWED and parts[1] != layer:
            assert parts[1] in ALLOWED[layer], f"{path.name}: layer {layer} must not import {mod}"
        if layer in NO_TORCH:
            assert parts[0] != "torch", f"{path.name}: layer {layer} must not import torch"
        if layer in NO_DIST:
            assert not mod.startswith("torch.distributed"), f"{path.name}: {layer} must not import torch.distributed"


@pytest.mark.unit
def test_every_layer_is_checked():
    present = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert present <= set(ALLOWED), f"unchecked layers: {present - set(ALLOWED)}"

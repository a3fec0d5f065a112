"""Imports flow one way (docs/architecture.md), and no modules import each other in a cycle. Parsed statically with
ast, so the test also covers lazy imports. A layer is a folder of src/tidal/ or a top-level module (`api.py`)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "tidal"

# layer -> tidal layers it may import (itself always allowed)
ALLOWED = {
    "core": set(),
    "costmodel": {"core"},
    "planner": {"core", "costmodel"},
    # the compared systems (WLB-LLM, FlexPipe, fixed packing), every packing by name; above the planner (decision 106)
    "baselines": {"core", "costmodel", "planner"},
    # bounds proven after planning, opt-in (LP-priced certificates, the dispatch MILP); above the planner (decision 114)
    "proof": {"core", "costmodel", "planner"},
    "api": {"core", "costmodel", "planner", "baselines"},  # tidal.Planner, the library (docs/library.md)
    "simulator": {"core", "costmodel", "planner", "baselines"},
    "data": {"core"},
    "models": {"core"},
    "runtime": {"core", "costmodel", "planner", "baselines", "models", "data"},
    "cli": {"core", "costmodel", "planner", "baselines", "proof", "simulator", "data", "models", "runtime"},
}
NO_TORCH = {"core", "costmodel", "planner", "baselines", "proof", "api", "simulator"}
NO_DIST = NO_TORCH | {"models", "data"}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for f in SRC.rglob("*.py"):
        parts = list(f.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the tidal modules it imports (`from tidal.x import y` names module tidal.x.y where there is one)."""
    graph = {}
    for name, path in mods.items():
        deps = set()
        for mod in _imports(path):
            if mod in mods:
                deps.add(mod)
            elif mod.rpartition(".")[0] in mods:
                deps.add(mod.rpartition(".")[0])
        deps.discard(name)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = n
        n += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n
                    n += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


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
        if (SRC / f"{layer}.py").exists():
            yield layer, SRC / f"{layer}.py"
        for f in sorted((SRC / layer).rglob("*.py")) if (SRC / layer).exists() else []:
            yield layer, f


def _violations(layer: str, mods: list[str]) -> list[str]:
    """What of `mods` (dotted imports of one file of `layer`) breaks the layering."""
    out = []
    for mod in mods:
        parts = mod.split(".")
        if parts[0] == "tidal" and len(parts) > 1 and parts[1] in ALLOWED and parts[1] not in ALLOWED[layer] | {layer}:
            out.append(f"layer {layer} must not import {mod}")
        if layer in NO_TORCH and parts[0] == "torch":
            out.append(f"layer {layer} must not import torch")
        if layer in NO_DIST and mod.startswith("torch.distributed"):
            out.append(f"{layer} must not import torch.distributed")
    return out


@pytest.mark.unit
@pytest.mark.parametrize("layer,path", list(_files()), ids=lambda x: str(x).split("src/tidal/")[-1])
def test_imports_flow_one_way(layer, path):
    bad = _violations(layer, _imports(path))
    assert not bad, f"{path.name}: {bad}"


@pytest.mark.unit
def test_layer_check_flags_the_planner_importing_a_baseline():
    """The check itself: the planner may not import the baselines (nor the API, nor torch); a baseline may import the
    planner."""
    assert _violations("planner", ["tidal.baselines.wlb", "tidal.baselines.wlb.pack"]) == [
        "layer planner must not import tidal.baselines.wlb", "layer planner must not import tidal.baselines.wlb.pack"]
    assert _violations("planner", ["tidal.api"]) and _violations("baselines", ["torch"])
    assert _violations("baselines", ["tidal.planner.stepper", "tidal.core.errors"]) == []
    # the proofs after planning sit above the planner too (decision 114)
    assert _violations("planner", ["tidal.proof.lp"]) == ["layer planner must not import tidal.proof.lp"]
    assert _violations("proof", ["tidal.planner.bounds"]) == [] and _violations("runtime", ["tidal.proof.milp"])


@pytest.mark.unit
def test_every_layer_is_checked():
    present = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("__")}
    present |= {p.stem for p in SRC.glob("*.py") if not p.stem.startswith("__")}
    assert present <= set(ALLOWED), f"unchecked layers: {present - set(ALLOWED)}"


@pytest.mark.unit
def test_no_import_cycles():
    """No two modules import each other, directly or through others (lazy imports included)."""
    cycles = _cycles(_graph(_modules()))
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.unit
def test_cycle_check_finds_a_cycle():
    """The check itself: a three-module cycle is found, a chain is not."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.unit
def test_the_cp_layout_types_are_core():
    """The runtime reads the CP layout type from core; the planner's algorithms build it."""
    for f in sorted((SRC / "runtime").rglob("*.py")):
        assert "tidal.planner.cp_sharding.CPShard" not in _imports(f), f"{f.name}: import CPShard from tidal.core"

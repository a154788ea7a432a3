"""The package imports one way: no cycles between its modules, and no module imports from a layer
above its own (the table in medusa_whisper/layers.py). Imports are read from the source with ``ast``,
so those inside functions count; only imports under ``if TYPE_CHECKING:`` are exempt (they never
run). Importing a submodule also runs its parent packages' ``__init__``; those implicit imports are
not counted (see layers.py)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

from medusa_whisper.layers import LAYERS, layer_of

PACKAGE = "medusa_whisper"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


class Import(NamedTuple):
    target: str  # a module of the package
    line: int


def package_modules(root: Path = ROOT) -> Dict[str, Path]:
    """{dotted module name: file} of every module and package under ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, module: str, is_package: bool, known: set) -> List[Import]:
    """The package modules that ``source`` (the text of ``module``) imports, anywhere in it.

    ``from X import name`` counts as importing ``X.name`` when that is a module (``from . import
    compute``), else ``X``. Names outside the package are ignored.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: List[Import] = []

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the else branch runs
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno) for alias in node.names
                         if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."))
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node)
            if base == PACKAGE or base.startswith(PACKAGE + "."):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.append(Import(full if full in known else base, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return [i for i in found if i.target != module]


def import_graph() -> Dict[str, List[Import]]:
    modules = package_modules()
    known = set(modules)
    return {name: imports_of(path.read_text(), name, path.name == "__init__.py", known)
            for name, path in modules.items()}


def find_cycle(graph: Dict[str, List[Import]]) -> Optional[List[str]]:
    """One import cycle as [a, b, ..., a], or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for edge in graph.get(node, ()):
            if state.get(edge.target) == 1:
                return path[path.index(edge.target):] + [edge.target]
            if edge.target not in state:
                cycle = visit(edge.target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_every_module_is_in_exactly_one_layer():
    listed = [m for layer in LAYERS for m in layer.modules]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    modules = set(package_modules())
    assert not modules - set(listed), f"modules missing from medusa_whisper/layers.py: {sorted(modules - set(listed))}"
    assert not set(listed) - modules, f"layers.py lists modules that do not exist: {sorted(set(listed) - modules)}"
    assert all(layer.reason for layer in LAYERS)


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_imports_from_a_higher_layer():
    layer = layer_of()
    modules = package_modules()
    upward = []
    for module, imports in import_graph().items():
        for edge in imports:
            if layer.get(edge.target, -1) > layer.get(module, len(LAYERS)):
                upward.append(f"{modules[module].relative_to(ROOT.parent)}:{edge.line}: {module} "
                              f"({LAYERS[layer[module]].name}) imports {edge.target} ({LAYERS[layer[edge.target]].name})")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_the_reader_sees_imports_inside_functions_relative_ones_and_skips_type_checking():
    source = """
from typing import TYPE_CHECKING
import os
import medusa_whisper.decoder as d
from .. import compute
from . import features
from ..drafting.tree import CandidateTree
if TYPE_CHECKING:
    from ..model import MedusaWhisper
else:
    from ..heads import MedusaHeads

def late():
    from medusa_whisper import weights, load_model
    class Inner:
        def f(self):
            from ..masks import chain_mask
"""
    known = {"medusa_whisper", "medusa_whisper.decoder", "medusa_whisper.compute", "medusa_whisper.drafting",
             "medusa_whisper.drafting.tree", "medusa_whisper.heads", "medusa_whisper.model", "medusa_whisper.weights",
             "medusa_whisper.masks", "medusa_whisper.training", "medusa_whisper.training.features"}
    # read as medusa_whisper/training/x.py: "." is medusa_whisper.training, ".." is medusa_whisper
    found = {i.target for i in imports_of(source, "medusa_whisper.training.x", False, known)}
    assert found == {"medusa_whisper.decoder", "medusa_whisper.compute", "medusa_whisper.training.features",
                     "medusa_whisper.drafting.tree", "medusa_whisper.heads", "medusa_whisper.weights",
                     "medusa_whisper", "medusa_whisper.masks"}
    assert find_cycle({"a": [Import("b", 1)], "b": [Import("c", 1)], "c": [Import("a", 1)]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": [Import("b", 1)], "b": []}) is None


def test_the_package_never_imports_the_repository_tools():
    """tools/ (python -m tools.bench, tools.data) sits above everything and is not installed with the wheel."""
    offenders = []
    for module, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(name == "tools" or name.startswith("tools.") for name in names):
                offenders.append(f"{module}:{node.lineno}")
    assert not offenders, "medusa_whisper imports tools: " + ", ".join(offenders)


def folder_of(module: str) -> str:
    """The unit the layout shows: a subpackage (``medusa_whisper.step``) for the modules in it, the
    module itself at the top (``medusa_whisper.model``, the facade ``medusa_whisper``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (ROOT / parts[-1]).is_dir() else module


def test_the_folders_import_one_way():
    """Between the subpackages (and the top-level modules), imports make no cycle: each folder sits
    above the ones it imports, as the layers do within it."""
    graph: Dict[str, List[Import]] = {}
    for module, imports in import_graph().items():
        here = folder_of(module)
        graph.setdefault(here, [])
        graph[here] += [Import(folder_of(i.target), i.line) for i in imports if folder_of(i.target) != here]
    cycle = find_cycle(graph)
    assert cycle is None, "folders import each other: " + " -> ".join(cycle)


def test_the_top_folder_holds_at_most_a_dozen_modules():
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
    assert len(top) <= 12, f"{len(top)} modules at the top of the package: {top}"

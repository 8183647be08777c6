"""The package's structure as a test: imports only point down the layers, and nothing cycles.

Every import counts, including those inside functions (a local import hides a dependency; it
does not remove it). The layer order is written here, not read from the code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "convergent"

# Bottom to top. Packages in one layer may not import each other: the algorithm packages meet
# only in train/ and studies/. The commands sit above the studies, since `reproduce` and
# `report` run and read them; a study never reads a command's configuration.
LAYERS: list[set[str]] = [
    {"report", "io", "wording", "cli_help", "acting"},
    {"models"},
    {"data"},
    {"losses"},
    {"optim", "sparse", "constrained", "regularize"},
    {"registration"},  # registers sparse's transformers reader on `import convergent`
    {"diagnostics"},
    {"train"},
    {"studies"},
    {"commands"},
    {"cli"},
    {"__main__"},
]
LAYER_OF = {name: index for index, layer in enumerate(LAYERS) for name in layer}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import of a convergent module in ``path``."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "convergent":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "convergent":
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                candidate = f"{target}.{alias.name}"
                yield (candidate if candidate in MODULES else target), node.lineno


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


GRAPH = {module: sorted(set(_imports(module, path))) for module, path in MODULES.items()}


def test_every_package_has_a_layer():
    packages = {_package(module) for module in MODULES} - {""}
    assert packages <= set(LAYER_OF), f"packages without a layer: {packages - set(LAYER_OF)}"


def upward_imports(graph: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Each import whose target package is not in a lower layer than its source's."""
    wrong = []
    for module, imports in graph.items():
        source = _package(module)
        for target, line in imports:
            destination = _package(target)
            if not source or not destination or source == destination:
                continue
            if LAYER_OF[destination] >= LAYER_OF[source]:
                wrong.append(f"{module}:{line} imports {target}")
    return wrong


def import_cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    edges = {module: sorted({target for target, _ in imports}) for module, imports in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in edges:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(edges[root]))]
        while work:
            node, children = work[-1]
            child = next((c for c in children if c in edges), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_imports_only_point_down_the_layers():
    wrong = upward_imports(GRAPH)
    assert not wrong, "imports that do not point down the layers:\n" + "\n".join(wrong)


def test_no_module_imports_itself_through_a_cycle():
    cycles = import_cycles(GRAPH)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checks_report_a_planted_upward_import_and_cycle():
    planted = {
        "convergent.optim.horst": [("convergent.sparse.masks", 3)],  # sideways
        "convergent.models.hf": [("convergent.train.loop", 7)],  # upward
        "convergent.train.loop": [("convergent.models.hf", 1)],
        "convergent.data.a": [("convergent.data.b", 1)],
        "convergent.data.b": [("convergent.data.c", 1)],
        "convergent.data.c": [("convergent.data.a", 2)],
        "convergent.sparse.masks": [],
    }
    assert upward_imports(planted) == [
        "convergent.optim.horst:3 imports convergent.sparse.masks",
        "convergent.models.hf:7 imports convergent.train.loop",
    ]
    assert sorted(import_cycles(planted)) == [
        ["convergent.data.a", "convergent.data.b", "convergent.data.c"],
        ["convergent.models.hf", "convergent.train.loop"],
    ]

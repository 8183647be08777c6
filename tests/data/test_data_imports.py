"""The data modules import each other in layers: no cycle, no import hidden in a function.

Every ``import`` of ``src/convergent/data/*.py`` is read with ``ast``, those inside
functions and classes included. A cycle, or a function-local import of a sibling data
module (which is how a cycle hides), fails; so does an import that goes against the layer
order written in the package docstring. Local imports of third-party packages are fine.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import convergent.data

PACKAGE = "convergent.data"
INIT = "__init__"
DATA_DIR = Path(convergent.data.__file__).parent


class DataImport:
    """One import of a sibling data module: where it is and whether it is inside a function."""

    def __init__(self, source: str, target: str, line: int, local: bool) -> None:
        self.source, self.target, self.line, self.local = source, target, line, local

    def __repr__(self) -> str:
        where = "inside a function or class" if self.local else "at module level"
        return f"{self.source}.py:{self.line} imports {self.target} {where}"


def _absolute(module: str | None, level: int) -> str:
    """The absolute name of ``from <level dots><module> import ...`` in the data package."""
    if level == 0:
        return module or ""
    base = PACKAGE.split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _targets(node: ast.Import | ast.ImportFrom, modules: set[str]) -> list[str]:
    """The data modules (``__init__`` for the package itself) that ``node`` imports."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        package = _absolute(node.module, node.level)
        names = [package]
        if package == PACKAGE:  # ``from convergent.data import hub`` names a module
            names += [f"{package}.{alias.name}" for alias in node.names]
    targets = []
    for name in names:
        if name == PACKAGE:
            targets.append(INIT)
        elif name.startswith(PACKAGE + "."):
            module = name.removeprefix(PACKAGE + ".").split(".")[0]
            if module in modules:
                targets.append(module)
    return targets


def data_imports(sources: dict[str, str]) -> list[DataImport]:
    """Every import of a data module by another, from module name -> source text."""
    modules = set(sources)
    found: list[DataImport] = []

    def visit(module: str, node: ast.AST, local: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            for target in _targets(node, modules):
                if target != module:
                    found.append(DataImport(module, target, node.lineno, local))
        inner = local or isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda
        )
        for child in ast.iter_child_nodes(node):
            visit(module, child, inner)

    for module, text in sources.items():
        visit(module, ast.parse(text), local=False)
    return found


def find_cycle(imports: list[DataImport]) -> list[str] | None:
    """One import cycle among the modules, as [a, b, ..., a], or None."""
    graph: dict[str, set[str]] = {}
    for edge in imports:
        graph.setdefault(edge.source, set()).add(edge.target)
    state: dict[str, str] = {}  # "open" while on the current path, "done" once explored
    path: list[str] = []

    def explore(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := explore(target)):
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := explore(module)):
            return cycle
    return None


def documented_layers(docstring: str, modules: set[str]) -> dict[str, int]:
    """Module -> layer number, from the numbered list of the package docstring (the names
    in double backquotes outside parentheses of each item)."""
    items: dict[int, str] = {}
    current = None
    for line in docstring.splitlines():
        numbered = re.match(r"^(\d+)\. (.*)", line)
        if numbered:
            current = int(numbered.group(1))
            items[current] = numbered.group(2)
        elif current is not None and line.startswith("   ") and line.strip():
            items[current] += " " + line.strip()
        else:
            current = None
    layers: dict[str, int] = {}
    for number, text in items.items():
        for name in re.findall(r"``(\w+)``", re.sub(r"\([^)]*\)", "", text)):
            if name in modules:
                layers.setdefault(name, number)
    return layers


def read_data_package() -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(DATA_DIR.glob("*.py"))}


def test_the_checks_catch_a_cycle_a_local_import_and_a_package_import() -> None:
    sources = {
        INIT: "from convergent.data.a import f\n",
        "a": "import numpy\nfrom convergent.data.b import g\n\ndef f():\n    import torch\n",
        "b": "def g():\n    from .a import f\n",
    }
    imports = data_imports(sources)
    assert find_cycle(imports) == ["a", "b", "a"]
    assert [(edge.source, edge.target) for edge in imports if edge.local] == [("b", "a")]
    # Importing the package from a module it imports is a cycle through ``__init__``.
    through_package = data_imports({**sources, "b": "from convergent.data import f\n"})
    assert find_cycle(through_package) == [INIT, "a", "b", INIT]
    assert find_cycle(data_imports({**sources, "b": "from . import a\n"})) is not None
    # Third-party packages and other convergent packages do not count.
    outside = "from ..models import unwrap_model\nimport convergent.train\nimport numpy\n"
    assert data_imports({"a": outside, "b": ""}) == []
    assert find_cycle(data_imports({"a": "from .b import g\n", "b": ""})) is None


def test_data_modules_import_each_other_without_a_cycle() -> None:
    assert find_cycle(data_imports(read_data_package())) is None


def test_no_data_module_imports_a_sibling_inside_a_function() -> None:
    assert [edge for edge in data_imports(read_data_package()) if edge.local] == []


def test_imports_follow_the_layers_of_the_package_docstring() -> None:
    sources = read_data_package()
    layers = documented_layers(convergent.data.__doc__ or "", set(sources))
    assert sorted(layers) == sorted(set(sources) - {INIT}), "every module has a layer"
    against = [
        f"{edge!r}: layer {layers[edge.source]} -> {layers[edge.target]}"
        for edge in data_imports(sources)
        if edge.source != INIT and layers[edge.target] >= layers[edge.source]
    ]
    assert against == []

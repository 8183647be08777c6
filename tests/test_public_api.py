"""The studies and the examples as users of the library: they import its public API only.

A study is a recipe beside the library (docs/design.md, "Studies"): it may import a library
package's public names (``from convergent.optim import HORST``, the name in ``__all__``), the
shared study framework's public names, and its own sub-package; never a library submodule,
another study, or a private name. Every study has the same files. The whole package imports
one way: absolute. The rules are written here; each check is also shown to fail on a planted
violation.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "convergent"
STUDIES = SOURCE / "studies"
FRAMEWORK = "convergent.studies.framework"
# The study engine (the loop every study runs) is shared like the framework, and built on it.
ENGINE = "convergent.studies.engine"
SHARED = ("framework", "engine")
STUDY_FILES = {"__init__.py", "config.py", "study.py", "runs.py", "claims.py", "report.py"}
# A study sub-package may add modules for a distinct procedure, named by its role.
EXTRA_STUDY_FILES = {
    "pilot.py",
    "null.py",
    "models.py",
    "measures.py",
    "plots.py",
    "checks.py",
    "wording.py",
    "summary.py",
    "brief.py",
    "language.py",
    "selection.py",
    "keys.py",  # the claims' keys, where claims are scored in more than one module
}
# A part that has its own procedure names its modules PART_ROLE.py (language_claims.py,
# finetune_runs.py): one of these roles, beside the study's own modules.
PART_ROLES = {"config", "runs", "part", "claims", "report", "summary"}


def outside_the_shape(files: set[str]) -> list[str]:
    """The modules of a study folder that neither the shape nor a part's role names."""
    return sorted(
        name
        for name in files - STUDY_FILES - EXTRA_STUDY_FILES
        if not (
            "_" in name
            and name.removesuffix(".py").split("_", 1)[1] in PART_ROLES
            and not name.startswith("_")
        )
    )


def study_names() -> list[str]:
    return sorted(
        path.name
        for path in STUDIES.iterdir()
        if path.is_dir() and path.name not in SHARED and (path / "__init__.py").is_file()
    )


def _from_imports(path: Path) -> Iterator[tuple[ast.ImportFrom | ast.Import, int]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, node.lineno


def relative_imports(path: Path) -> list[str]:
    """Each ``from . import`` / ``from ..x import`` in ``path``."""
    return [
        f"{path.name}:{line}"
        for node, line in _from_imports(path)
        if isinstance(node, ast.ImportFrom) and node.level
    ]


def _public(module: str) -> set[str]:
    return set(getattr(importlib.import_module(module), "__all__", ()))


def non_public_imports(source: str, own_package: str, studies: bool = False) -> list[str]:
    """Each import in ``source`` (a module's text) of a convergent name that is not public.

    Allowed: ``from convergent.<package> import name`` with ``name`` in that package's
    ``__all__`` for a library package; the same for ``convergent.studies.framework``, for
    ``convergent.studies.engine`` and, with ``studies`` (a user's script), for a study package;
    anything from ``own_package``.
    """
    wrong = []
    for node, line in _from_imports_text(source):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("convergent") and alias.name != "convergent":
                    wrong.append(f"{line}: import {alias.name}")
            continue
        module = node.module or ""
        if node.level or not module.startswith("convergent"):
            continue
        if own_package and (module == own_package or module.startswith(own_package + ".")):
            continue
        if module == "convergent":  # whole library packages: `from convergent import optim`
            hidden = [a.name for a in node.names if a.name.startswith("_") or a.name == "studies"]
            wrong.extend(f"{line}: from convergent import {name}" for name in hidden)
            continue
        parts = module.split(".")
        is_library_package = len(parts) == 2 and parts[1] != "studies"
        is_study = studies and len(parts) == 3 and parts[1] == "studies"
        if not (is_library_package or is_study or module in (FRAMEWORK, ENGINE)):
            wrong.append(f"{line}: from {module} import ...")
            continue
        public = _public(module)
        for alias in node.names:
            if alias.name not in public:
                wrong.append(f"{line}: from {module} import {alias.name} (not in its __all__)")
    return wrong


def _from_imports_text(source: str) -> Iterator[tuple[ast.ImportFrom | ast.Import, int]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, node.lineno


def test_there_are_studies():
    assert set(study_names()) >= {"descent", "langevin", "residual", "sparsity"}


@pytest.mark.parametrize("study", study_names())
def test_every_study_has_the_same_files(study):
    files = {path.name for path in (STUDIES / study).glob("*.py")}
    assert files >= STUDY_FILES, f"{study} lacks {sorted(STUDY_FILES - files)}"
    assert not outside_the_shape(files), (
        f"{study} has modules outside the shape: {outside_the_shape(files)}"
    )


@pytest.mark.parametrize("study", study_names())
def test_a_study_imports_only_public_names(study):
    package = f"convergent.studies.{study}"
    wrong = [
        f"{path.relative_to(SOURCE)}:{problem}"
        for path in sorted((STUDIES / study).glob("*.py"))
        for problem in non_public_imports(path.read_text(), package)
    ]
    assert not wrong, "imports beyond the public API:\n" + "\n".join(wrong)


def test_the_framework_and_the_engine_import_only_public_library_names():
    # The engine is the framework's loop: it may read the framework's modules, and its own.
    wrong = [
        f"{path.relative_to(SOURCE)}:{problem}"
        for package in SHARED
        for path in sorted((STUDIES / package).glob("*.py"))
        for problem in non_public_imports(path.read_text(), FRAMEWORK)
        if not problem.split(": ", 1)[1].startswith(f"from {ENGINE}")
    ]
    assert not wrong, "imports beyond the public API:\n" + "\n".join(wrong)


def test_examples_import_only_public_names():
    # Benchmarks may time private paths (a fast path against its reference); examples may not.
    wrong = [
        f"{path.relative_to(ROOT)}:{problem}"
        for path in sorted((ROOT / "examples").glob("*.py"))
        for problem in non_public_imports(path.read_text(), "", studies=True)
    ]
    assert not wrong, "imports beyond the public API:\n" + "\n".join(wrong)


def test_the_package_imports_one_way_absolute():
    wrong = [
        f"{path.relative_to(SOURCE)}:{where.split(':')[1]}"
        for path in sorted(SOURCE.rglob("*.py"))
        for where in relative_imports(path)
    ]
    assert not wrong, "relative imports:\n" + "\n".join(wrong)


def test_the_checks_catch_planted_violations():
    planted = """
from convergent.optim import HORST
from convergent.optim.horst import group_alpha
from convergent.optim import _fast
from convergent.studies.framework import finish
from convergent.studies.framework.units import UnitCache
from convergent.studies.sparsity import run
from convergent.studies.descent.config import Config
import convergent.train.loop
"""
    found = non_public_imports(planted, "convergent.studies.descent")
    assert found == [
        "3: from convergent.optim.horst import ...",
        "4: from convergent.optim import _fast (not in its __all__)",
        "6: from convergent.studies.framework.units import ...",
        "7: from convergent.studies.sparsity import ...",
        "9: import convergent.train.loop",
    ]


def test_a_script_may_use_a_study_package_but_not_its_modules():
    planted = "from convergent.studies.sparsity import STUDY\nfrom convergent.studies.sparsity.runs import x\n"
    assert non_public_imports(planted, "", studies=True) == [
        "2: from convergent.studies.sparsity.runs import ..."
    ]


def test_the_relative_import_check_catches_one(tmp_path):
    module = tmp_path / "planted.py"
    module.write_text("from __future__ import annotations\nfrom .claims import Claim\n")
    assert relative_imports(module) == ["planted.py:2"]


def test_the_shape_admits_a_part_by_its_role_and_nothing_else():
    files = {"finetune_runs.py", "language_claims.py", "helpers.py", "x_stuff.py", "_claims.py"}
    assert outside_the_shape(files) == ["_claims.py", "helpers.py", "x_stuff.py"]

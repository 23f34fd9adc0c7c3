"""The lowerings speak one builder vocabulary (issue #29): checked on their source with
`ast`, so it stays true as families are added.

* A family (a module of compiler/lowering/, or a package such as linalg/ or special/)
  imports no underscored name from another family or from a shared module: what several
  families need is public, named for what it builds, and defined in one place.
* No lowering reaches into the importer: graph-level facts come through the lowering
  context's typed fields (`ctx.dynamic`, `ctx.process_groups`, `ctx.row_layouts`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LOWERING = Path(__file__).resolve().parents[3] / "compiler" / "lowering"


def _family(path: Path) -> str:
    """A module's family: its package under compiler/lowering/, or its own name."""
    parts = path.relative_to(LOWERING).parts
    return parts[0] if len(parts) > 1 else path.stem


def _imported_module(path: Path, node: ast.ImportFrom) -> Path | None:
    """The file or package folder a relative `from ... import` names; None when it lies
    outside compiler/lowering/ (the IR builders, the dtypes, the context)."""
    base = path.parent
    for _ in range(node.level - 1):
        base = base.parent
    target = base.joinpath(*node.module.split(".")) if node.module else base
    if LOWERING not in target.parents and target != LOWERING:
        return None
    return target if target.is_dir() else target.with_suffix(".py")


def _sources() -> list[tuple[Path, str]]:
    return [(path, path.read_text()) for path in sorted(LOWERING.rglob("*.py"))]


def cross_family_private_imports(sources) -> list[str]:
    """`file:line: name from module` for each underscored name a family imports from
    another family or a shared module."""
    found = []
    for path, text in sources:
        tree = ast.parse(text, filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            target = _imported_module(path, node)
            if target is None or _family(target) == _family(path):
                continue
            where = f"{path.relative_to(LOWERING)}:{node.lineno}"
            private_parts = [part for part in (node.module or "").split(".") if part.startswith("_")]
            if private_parts:
                found.append(f"{where}: module {'.'.join(private_parts)}")
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{where}: {alias.name} from {target.relative_to(LOWERING)}")
    return found


def importer_reach_backs(sources) -> list[str]:
    """`file:line` of each `.importer` attribute read in the lowerings."""
    found = []
    for path, text in sources:
        tree = ast.parse(text, filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "importer":
                found.append(f"{path.relative_to(LOWERING)}:{node.lineno}")
    return found


def test_no_underscored_name_crosses_a_family():
    found = cross_family_private_imports(_sources())
    assert not found, "make these public (named for what they build) or keep them in their family:\n" + "\n".join(found)


def test_no_lowering_reaches_into_the_importer():
    found = importer_reach_backs(_sources())
    assert not found, "use the lowering context's fields instead of ctx.importer:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from .indexing import _gather\n", ["losses.py:1: _gather from indexing.py"]),
        ("from .linalg import _builders\n", ["losses.py:1: _builders from linalg"]),
        ("def f():\n    from .helpers import _probe\n", ["losses.py:2: _probe from helpers.py"]),
        ("from ._opmath import opmath_dtype\n", ["losses.py:1: module _opmath"]),
        ("from ..ir import add\nfrom .helpers import full\nfrom .losses import _REDUCTION_SUM\n", []),
    ],
)
def test_the_import_scan_sees_what_it_must(source, expected):
    # A stand-in text for a real family module: the scan resolves its imports from there.
    assert cross_family_private_imports([(LOWERING / "losses.py", source)]) == expected


def test_within_a_package_family_underscored_names_stay_allowed():
    source = "from ._values import _T\nfrom ..helpers import _NUMPY_DTYPES\n"
    found = cross_family_private_imports([(LOWERING / "special" / "gamma.py", source)])
    assert found == ["special/gamma.py:2: _NUMPY_DTYPES from helpers.py"]


def test_the_reach_back_scan_sees_ctx_importer():
    source = "def rule(ctx):\n    x = 1\n    return ctx.importer.dynamic\n"
    assert importer_reach_backs([(LOWERING / "losses.py", source)]) == ["losses.py:3"]

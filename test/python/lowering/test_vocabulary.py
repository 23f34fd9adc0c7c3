"""How the lowerings are written (issue #29), checked on their source with `ast`, so it
stays true as families are added.

* No lowering reaches into the importer: graph-level facts come through the lowering
  context's typed fields (`ctx.dynamic`, `ctx.process_groups`, `ctx.row_layouts`).
"""

from __future__ import annotations

import ast
from pathlib import Path


LOWERING = Path(__file__).resolve().parents[3] / "compiler" / "lowering"


def _sources() -> list[tuple[Path, str]]:
    return [(path, path.read_text()) for path in sorted(LOWERING.rglob("*.py"))]


def importer_reach_backs(sources) -> list[str]:
    """`file:line` of each `.importer` attribute read in the lowerings."""
    found = []
    for path, text in sources:
        tree = ast.parse(text, filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "importer":
                found.append(f"{path.relative_to(LOWERING)}:{node.lineno}")
    return found


def test_no_lowering_reaches_into_the_importer():
    found = importer_reach_backs(_sources())
    assert not found, "use the lowering context's fields instead of ctx.importer:\n" + "\n".join(found)


def test_the_reach_back_scan_sees_ctx_importer():
    source = "def rule(ctx):\n    x = 1\n    return ctx.importer.dynamic\n"
    assert importer_reach_backs([(LOWERING / "losses.py", source)]) == ["losses.py:3"]

"""The generated reference docs are up to date, say what their tables hold, and the
how-to's example pass is real code that works as the page says."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from torch_tpu.tools import gendocs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", [path for path, _ in gendocs.GENERATED_DOCS])
def test_generated_doc_is_up_to_date(path: str) -> None:
    generator = dict(gendocs.GENERATED_DOCS)[path]
    target = ROOT / path
    assert target.exists(), f"{path} is missing; generate it with: {gendocs.REGENERATE}"
    assert target.read_text(encoding="utf-8") == gendocs.render(generator), (
        f"{path} is stale: its source table changed. Regenerate it with: {gendocs.REGENERATE}"
    )


def test_check_reports_stale_and_missing_docs(tmp_path: Path) -> None:
    out = io.StringIO()
    assert gendocs.main(["--check", "--root", str(tmp_path)], out) == 1
    for path, _ in gendocs.GENERATED_DOCS:
        assert f"gendocs: {path} is stale or missing" in out.getvalue()
    assert gendocs.REGENERATE in out.getvalue()

    assert gendocs.main(["--root", str(tmp_path)], io.StringIO()) == 0
    assert gendocs.main(["--check", "--root", str(tmp_path)], io.StringIO()) == 0

    first = gendocs.GENERATED_DOCS[0][0]
    (tmp_path / first).write_text("# edited by hand\n", encoding="utf-8")
    out = io.StringIO()
    assert gendocs.main(["--check", "--root", str(tmp_path)], out) == 1
    assert out.getvalue().splitlines()[0] == f"gendocs: {first} is stale or missing"


def test_generators_can_be_named_lazily(tmp_path: Path) -> None:
    docs = [("docs/x.md", "torch_tpu.tools.gendocs:env_markdown")]
    assert gendocs.stale_docs(tmp_path, docs) == ["docs/x.md"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/x.md").write_text(gendocs.render(gendocs.env_markdown), encoding="utf-8")
    assert gendocs.stale_docs(tmp_path, docs) == []


def test_passes_doc_covers_every_pass_and_option() -> None:
    from torch_tpu.compiler.passes import PASS_REGISTRY
    from torch_tpu.compiler.pipeline import FUNC_ANCHORED_UPSTREAM, MODULE_LEVEL_UPSTREAM

    text = gendocs.passes_markdown()
    for argument, cls in PASS_REGISTRY.items():
        assert f"## `{argument}`" in text
        assert cls.summary in text
        for option in cls.options:
            assert re.search(rf"\| `{re.escape(option.name)}` \| {option.type.__name__} \|", text), option
            for choice in option.choices:
                assert f"`{choice}`" in text
    for name in (*MODULE_LEVEL_UPSTREAM, *FUNC_ANCHORED_UPSTREAM):
        assert f"`{name}`" in text


def test_dialect_doc_covers_every_op_operand_and_type() -> None:
    from torch_tpu.compiler.dialect import TORCHTPU
    from torch_tpu.compiler.dialect.spec import KNOWN_TYPES

    text = gendocs.dialect_markdown()
    for spec in TORCHTPU.ops.values():
        assert f"### `{spec.full_name}`" in text
        assert spec.summary in text
        for operand in spec.operands:
            assert f"| `{operand.name}` | {operand.type.description} |" in text
        for result in spec.results:
            assert f"| `{result.name}` | {result.type.description} |" in text
        for attr in spec.attributes:
            assert f"| `{attr.name}` |" in text
    for name in KNOWN_TYPES:
        assert f"`!torchtpu.{name}`" in text


def test_env_doc_covers_every_variable() -> None:
    from torch_tpu.config import ENV_VARS

    text = gendocs.env_markdown()
    for name, var in ENV_VARS.items():
        assert f"`{name}`" in text
        assert " ".join(var.help.split()).replace("|", "\\|") in text


def test_ops_doc_names_each_family_by_its_module_or_package() -> None:
    """A family split into a package (linalg/, special/) is one family named after the
    package, and ops.md points at a source that exists for every family."""
    import torch
    from torch_tpu.compiler.lowering import LOWERINGS, docs
    from torch_tpu.compiler.lowering.registry import family_of

    assert family_of("torch_tpu.compiler.lowering.linalg.qr") == "linalg"
    assert family_of("torch_tpu.compiler.lowering.losses") == "losses"
    assert family_of("test_something") == "test_something"
    assert LOWERINGS[torch.ops.aten.linalg_qr.default].family == "linalg"
    assert LOWERINGS[torch.ops.aten.special_bessel_j0.default].family == "special"
    text = docs.ops_markdown()
    lowering_dir = ROOT / "compiler/lowering"
    for family in {low.family for low in LOWERINGS.values()}:
        assert not family.startswith("_"), family
        source = re.search(rf"## {family}\n\n`compiler/lowering/([^`]+)`", text).group(1)
        assert (lowering_dir / source).exists(), source


# --------------------------------------------------------------------------------------
# docs/howto/write-a-pass.md: its example pass and its lit test run as written
# --------------------------------------------------------------------------------------
HOWTO = ROOT / "docs/howto/write-a-pass.md"


def _code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", HOWTO.read_text(encoding="utf-8"), re.DOTALL)


@pytest.fixture
def example_pass():
    from torch_tpu.compiler.passes import PASS_REGISTRY

    (source,) = [b for b in _code_blocks("python") if "@register_pass" in b]
    before = dict(PASS_REGISTRY)
    # Executed as if it were a module of compiler/passes/, relative imports included.
    namespace = {"__name__": "torch_tpu.compiler.passes._howto_example",
                 "__package__": "torch_tpu.compiler.passes"}
    exec(compile(source, str(HOWTO), "exec"), namespace)
    added = set(PASS_REGISTRY) - set(before)
    assert len(added) == 1, "the how-to's example must register exactly one pass"
    (argument,) = added
    try:
        yield argument, PASS_REGISTRY[argument]
    finally:
        PASS_REGISTRY.pop(argument)


def test_howto_example_pass_runs_its_documented_lit_test(example_pass) -> None:
    from torch_tpu.tools.opt import run

    argument, cls = example_pass
    assert cls.description and cls.summary
    (lit_test,) = [b for b in _code_blocks("mlir") if "RUN:" in b]
    run_line = re.search(r"// RUN: torchtpu-opt %s (.*)", lit_test).group(1)
    assert f"--{argument}" in run_line and "--verify-diagnostics" in run_line
    argv = [a for a in run_line.split() if a.startswith("--")]
    stderr = io.StringIO()
    rc = run(argv + ["-"], stdin=io.BytesIO(lit_test.encode()), stdout=io.StringIO(), stderr=stderr)
    assert rc == 0, stderr.getvalue()

    # And the expectations are not vacuous: without them, the errors are reported.
    stderr = io.StringIO()
    argv = [a for a in argv if a != "--verify-diagnostics"]
    rc = run(argv + ["-"], stdin=io.BytesIO(lit_test.encode()), stdout=io.StringIO(), stderr=stderr)
    assert rc == 1
    assert re.search(rf"<stdin>:\d+:\d+: error: {argument}: ", stderr.getvalue()), stderr.getvalue()


def test_howto_example_pass_is_documented_by_gendocs(example_pass) -> None:
    argument, cls = example_pass
    text = gendocs.passes_markdown()
    assert f"## `{argument}`" in text and cls.summary in text


# -- names the hand-written docs mention exist in the code --------------------------------
def _prose_docs() -> list[Path]:
    """README and docs/, which people read to learn names: what they name must exist."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _mentions(pattern: str) -> dict[str, list[str]]:
    """{name: [files that mention it]} for every match of `pattern` in the prose docs."""
    found: dict[str, list[str]] = {}
    for path in _prose_docs():
        for name in sorted(set(re.findall(pattern, path.read_text(encoding="utf-8")))):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_environment_variable_the_docs_name_is_declared() -> None:
    # env.md is generated from the configuration table (and checked for staleness above),
    # so its rows are exactly the variables torch_tpu reads.
    declared = set(re.findall(r"^\| `(TORCH_TPU_[A-Z0-9_]+)` \|", (ROOT / "docs/reference/env.md").read_text(), re.M))
    assert declared, "docs/reference/env.md lists no variables: the row pattern changed"
    unknown = {name: files for name, files in _mentions(r"\bTORCH_TPU_[A-Z0-9_]*[A-Z0-9]\b").items()
               if name not in declared}
    assert not unknown, f"the docs name environment variables torch_tpu does not read: {unknown}"


def _resolves(dotted: str) -> bool:
    """Whether `torch_tpu.a.b.c` names a module, or an attribute of the longest module
    prefix of it."""
    import importlib

    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def test_every_torch_tpu_name_the_docs_mention_resolves() -> None:
    names = _mentions(r"\btorch_tpu(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
    assert "torch_tpu.export" in names, "the pattern no longer finds the names the docs use"
    unresolved = {name: files for name, files in names.items() if not _resolves(name)}
    assert not unresolved, f"the docs mention names that do not exist: {unresolved}"


def test_the_torch_tpu_device_module_is_described_as_planned_until_it_exists() -> None:
    import torch

    import torch_tpu  # noqa: F401  (registers what torch_tpu adds to torch)

    if hasattr(torch, "tpu"):
        return
    for path in _prose_docs():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if re.search(r"\btorch\.tpu\b", line):
                assert "planned" in line, (
                    f"{path.relative_to(ROOT)}:{number} mentions torch.tpu, which does not exist yet; "
                    "say it is planned (#13)"
                )

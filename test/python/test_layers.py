"""The layer contracts of docs/explanation/architecture.md, enforced with import-linter.

The contracts live in pyproject.toml (`[tool.importlinter]`). import-linter finds modules
by walking the package's folder, but the source tree maps one distribution onto several
top-level folders (`[tool.setuptools] package-dir`), so each check runs `lint-imports` on
a copy laid out as installed. A negative test per contract proves a violation is caught.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
SOURCE_FOLDERS = ("python", "compiler", "runtime", "tools")


def _config() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


def _contract(contract_id: str) -> dict:
    for contract in _config()["tool"]["importlinter"]["contracts"]:
        if contract["id"] == contract_id:
            return contract
    raise KeyError(contract_id)


def _installed_layout(dest: Path) -> Path:
    """A copy of the sources with each package at its import path (`package-dir`)."""
    package_dir: dict[str, str] = _config()["tool"]["setuptools"]["package-dir"]
    # Parents first, so a subpackage's folder lands inside its parent's copy.
    for package, folder in sorted(package_dir.items(), key=lambda kv: kv[0].count(".")):
        shutil.copytree(
            ROOT / folder, dest / package.replace(".", "/"),
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True,
        )
    return dest


def _lint(layout: Path) -> subprocess.CompletedProcess:
    try:
        import importlinter  # noqa: F401
    except ImportError:
        pytest.fail("import-linter is missing: install the test extra (pip install -e '.[test]')")
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, str(PYPROJECT), "--no-cache"],
        cwd=layout, env={"PYTHONPATH": str(layout), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    return _installed_layout(tmp_path_factory.mktemp("installed"))


def test_layer_contracts_hold(layout: Path) -> None:
    result = _lint(layout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"Contracts: \d+ kept, 0 broken", result.stdout), result.stdout


LAYERS = "Layers: tools | examples | config -> exported -> backend"
PRIVATE = "A private module (_name) is imported only inside its package"

# Violations, one per rule: (file in the installed layout, created if missing, line added,
# contract name). A file that does not exist yet is a new module, which the contracts cover
# without being named in them.
VIOLATIONS = {
    "runtime imports the frontend": ("torch_tpu/runtime/cache.py", "from torch_tpu import config", LAYERS),
    "compiler imports the runtime": ("torch_tpu/compiler/pipeline.py", "import torch_tpu.runtime", LAYERS),
    "program imports the device": ("torch_tpu/program/key.py", "import torch_tpu.device", LAYERS),
    "device imports the backend": ("torch_tpu/device/_ops.py", "import torch_tpu.backend", LAYERS),
    "a new device module imports the backend": (
        "torch_tpu/device/_new_module.py", "import torch_tpu.backend", LAYERS),
    "backend imports export": ("torch_tpu/backend/_invoker.py", "import torch_tpu.exported", LAYERS),
    "spmd imports kernels (siblings are independent)": ("torch_tpu/spmd.py", "import torch_tpu.kernels", LAYERS),
    "distributed imports spmd (siblings are independent)": (
        "torch_tpu/distributed/_launch.py", "import torch_tpu.spmd", LAYERS),
    "lowering imports the importer": (
        "torch_tpu/compiler/lowering/registry.py", "from ..importer import fx_importer",
        "Compiler: importer | passes -> lowering -> dialect"),
    "core imports torch": ("torch_tpu/core/dtypes.py", "import torch", "The core imports only the standard library"),
    "frontend imports a private compiler module": (
        "torch_tpu/spmd.py", "from torch_tpu.compiler.passes import _partition_rules", PRIVATE),
    "export imports a private backend module": (
        "torch_tpu/exported/_saved_export.py", "from torch_tpu.backend import _inplace", PRIVATE),
    "a new kernel imports a private device module": (
        "torch_tpu/kernels/new_kernel.py", "from torch_tpu.device import _ops", PRIVATE),
    "tools import a private frontend module": (
        "torch_tpu/tools/run.py", "from torch_tpu.exported import _saved_export", PRIVATE),
    "device builds IR with jaxlib": (
        "torch_tpu/device/_ops.py", "from jaxlib.mlir.dialects import stablehlo",
        "The eager device builds IR through the compiler's builders"),
}


@pytest.mark.parametrize("violation", sorted(VIOLATIONS))
def test_a_violation_breaks_its_contract(violation: str, tmp_path: Path) -> None:
    path, line, contract = VIOLATIONS[violation]
    layout = _installed_layout(tmp_path)
    target = layout / path
    source = target.read_text() if target.exists() else '"""A module added after the contracts were written."""\n'
    target.write_text(source + f"\n{line}  # injected by test_layers\n")
    result = _lint(layout)
    assert result.returncode == 1, result.stdout + result.stderr
    report = " ".join(result.stdout.split())  # the report wraps long contract names
    assert re.search(r"Contracts: \d+ kept, 1 broken", report), result.stdout
    assert contract in report.split("Broken contracts", 1)[1], result.stdout


def test_the_frontend_is_packages_each_in_a_layer() -> None:
    """python/torch_tpu/ holds packages (and public modules), each named in a layer: the
    contracts name packages, so a module inside one is covered as it is written. A private
    module at the top would be every package's to import, outside every layer."""
    in_a_layer = {name.strip() for layer in _contract("layers")["layers"] for name in re.split(r"[|:]", layer)}
    lower = {package for package in _config()["tool"]["setuptools"]["package-dir"] if "." in package}
    for entry in sorted((ROOT / "python/torch_tpu").iterdir()):
        if entry.name == "__init__.py" or not (entry.suffix == ".py" or (entry / "__init__.py").exists()):
            continue
        module = f"torch_tpu.{entry.stem}"
        assert not entry.stem.startswith("_"), (
            f"{module}: a private module belongs inside the package that uses it (backend, exported, program, ...)"
        )
        assert module in in_a_layer or module in lower, (
            f"{module}: add it to a layer of the 'layers' contract in pyproject.toml"
        )


# -- the execution layer: no import cycle between the backend and the device -------------------

# Imports the 'layers' contract ignores: entry points that load every part of torch_tpu
# that registers with PyTorch, not part of the importing package's own import graph.
ENTRY_POINTS = sorted(tuple(part.strip() for part in expression.split("->"))
                      for expression in _contract("layers")["ignore_imports"])


def _reach_violations(layout: Path) -> list[str]:
    """Import chains that break the layering backend -> device -> program: a device module
    reaching a frontend module outside the device and the program, or a program module
    reaching one outside the program (grimp, which import-linter uses, on the installed
    layout). The 'layers' contract says the same; this check names every chain."""
    code = f"""
import sys
import grimp
graph = grimp.build_graph("torch_tpu", cache_dir=None)
for importer, imported in {ENTRY_POINTS!r}:
    graph.remove_import(importer=importer, imported=imported)
lower = ("torch_tpu.compiler", "torch_tpu.runtime", "torch_tpu.core", "torch_tpu.tools")
frontend = {{m for m in graph.modules if m.startswith("torch_tpu.") and not m.startswith(lower)}}
allowed = {{"torch_tpu.device": ("torch_tpu.device", "torch_tpu.program"), "torch_tpu.program": ("torch_tpu.program",)}}
for package, inside in allowed.items():
    for module in sorted(m for m in frontend if m == package or m.startswith(package + ".")):
        for target in sorted(graph.find_upstream_modules(module)):
            if target not in frontend:
                continue
            if target == "torch_tpu" or any(target == p or target.startswith(p + ".") for p in inside):
                continue
            chain = graph.find_shortest_chain(importer=module, imported=target)
            print(" -> ".join(chain))
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=layout, capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(layout), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_no_import_cycle_between_backend_and_device(layout: Path) -> None:
    violations = _reach_violations(layout)
    assert not violations, "the device or the program imports the layer above it:\n" + "\n".join(violations)


@pytest.mark.parametrize("path, line, expected", [
    ("torch_tpu/device/_ops.py", "from torch_tpu.backend import _compile",
     "torch_tpu.device._ops -> torch_tpu.backend._compile"),
    ("torch_tpu/program/invoker.py", "from torch_tpu.device import _graph_io",
     "torch_tpu.program.invoker -> torch_tpu.device._graph_io"),
])
def test_a_device_or_program_import_of_a_higher_layer_is_caught(path: str, line: str, expected: str,
                                                                 tmp_path: Path) -> None:
    layout = _installed_layout(tmp_path)
    target = layout / path
    target.write_text(target.read_text() + f"\n{line}  # injected by test_layers\n")
    assert expected in _reach_violations(layout)


# -- configuration: every torch_tpu variable is read through the typed table ----------------

_SOURCES = [p for folder in SOURCE_FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]
_ENV_READ = re.compile(
    r"""(?:os\.environ\.get|os\.getenv)\(\s*["']((?:TORCH_TPU|TPU)_\w+)["']"""
    r"""|os\.environ\[\s*["']((?:TORCH_TPU|TPU)_\w+)["']\s*\](?!\s*=[^=])"""  # a read, not a write
)
_CONFIG_GET = re.compile(r"""config\.get\(\s*["'](\w+)["']""")


def test_environment_is_read_only_through_the_config_table() -> None:
    core_config = ROOT / "python/torch_tpu/core/config.py"
    direct = []
    for path in _SOURCES:
        if path == core_config:
            continue
        for match in _ENV_READ.finditer(path.read_text()):
            direct.append(f"{path.relative_to(ROOT)}: {match.group(1) or match.group(2)}")
    assert not direct, "read these with torch_tpu.core.config.get (declare them in its table): " + ", ".join(direct)


def test_every_variable_read_is_declared() -> None:
    from torch_tpu.core.config import ENV_VARS

    read = {name for path in _SOURCES for name in _CONFIG_GET.findall(path.read_text())}
    assert read, "no config.get call found: the pattern is stale"
    assert read - set(ENV_VARS) == set()


def test_a_bad_value_names_the_variable_and_what_is_expected(monkeypatch) -> None:
    from torch_tpu.core import config

    monkeypatch.setenv("TORCH_TPU_NUM_CPU_DEVICES", "two")
    with pytest.raises(config.EnvVarError, match=r"TORCH_TPU_NUM_CPU_DEVICES='two': expected an integer"):
        config.get("TORCH_TPU_NUM_CPU_DEVICES")
    monkeypatch.setenv("TORCH_TPU_NUM_CPU_DEVICES", "")
    assert config.get("TORCH_TPU_NUM_CPU_DEVICES") == 1  # empty is unset: the table's default
    monkeypatch.setenv("TORCH_TPU_STRICT", "on")
    assert config.get("TORCH_TPU_STRICT") is True


MODULE = """
func.func @f(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}
"""


def test_torchtpu_opt_and_the_core_run_without_torch(tmp_path: Path) -> None:
    """torchtpu-opt on a .mlir file, and every core module, import no torch (nor jax);
    bench/tool_startup.py measures the start-up time this keeps."""
    source = tmp_path / "m.mlir"
    source.write_text(MODULE)
    code = (
        "import sys\n"
        "import torch_tpu.core.config, torch_tpu.core.dtypes, torch_tpu.core.attributes, torch_tpu.core.mlir_context\n"
        "import torch_tpu.core.user_frames\n"
        "assert torch_tpu.core.user_frames.is_user_file('/home/me/model.py')  # finds torch's folder, unimported\n"
        "from torch_tpu.tools.opt import main\n"
        f"rc = main([{str(source)!r}, '--torchtpu-compile-pipeline=precision=high'])\n"
        "print(rc, sorted(m for m in ('torch', 'jax') if m in sys.modules), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stderr.strip().splitlines()[-1] == "0 []", out.stderr
    assert "stablehlo.dot_general" in out.stdout


def test_one_version() -> None:
    """`torch_tpu.__version__` (the cache key's, the runtime's) is the core constant, and
    the distribution's version agrees with it."""
    import torch_tpu
    from torch_tpu.core import __version__

    assert torch_tpu.__version__ == __version__ == _config()["project"]["version"]

"""The wheel a user installs: built from this checkout, checked against the source tree,
installed into a fresh environment where `import torch` (with the device autoload on) and a
compiled call must work.

The editable install the other tests use maps the source folders directly, so it cannot see
a package the wheel leaves out: the wheel once lacked `torch_tpu.distributed`, and
`import torch` failed for every user ("Failed to load the backend extension: tpu").
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _package_dir() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def _source_files() -> set[str]:
    """Every file under the layer folders, at the path it must have in the wheel (the
    deepest package-dir mapping wins: compiler/ is torch_tpu/compiler, not python/...)."""
    files: set[str] = set()
    for package, folder in _package_dir().items():
        base = ROOT / folder
        nested = [ROOT / f for p, f in _package_dir().items() if p != package and p.startswith(package + ".")]
        for path in base.rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            if any(n in path.parents for n in nested):
                continue
            files.add(package.replace(".", "/") + "/" + path.relative_to(base).as_posix())
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: the build uses this environment's setuptools (CI needs no index).
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}"
    (path,) = out.glob("torch_tpu-*.whl")
    return path


def test_wheel_holds_every_source_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_source_files() - names)
    assert not missing, f"the wheel lacks {len(missing)} file(s) of the source tree: {missing[:20]}"


def test_wheel_declares_the_entry_points(wheel):
    archive = zipfile.ZipFile(wheel)
    (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = archive.read(entry_points).decode()
    for line in ("[torch.backends]", "tpu = torch_tpu.device._autoload:autoload", "[torch_dynamo_backends]",
                 "torchtpu-opt = torch_tpu.tools.opt:main", "torchtpu-run = torch_tpu.tools.run:main"):
        assert line in text, f"entry_points.txt lacks {line!r}:\n{text}"


def _fresh_environment(where: Path, wheel: Path) -> Path:
    """A new virtual environment holding the wheel and, linked in, this environment's
    third-party packages (torch, jaxlib, numpy ...) -- but not its editable torch_tpu."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    fresh_python = where / "bin" / "python"
    fresh_site = Path(subprocess.run(
        [str(fresh_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        lowered = entry.name.lower()
        if "torch_tpu" in lowered or lowered.startswith("__editable__") or entry.name == "__pycache__":
            continue
        (fresh_site / entry.name).symlink_to(entry)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(fresh_site), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"installing the wheel failed:\n{proc.stdout}\n{proc.stderr}"
    return fresh_python


_SMOKE = r"""
import torch, torch_tpu
assert torch_tpu.__file__.startswith(SITE), f"torch_tpu imported from {torch_tpu.__file__}, not the wheel"
assert hasattr(torch, "tpu"), "the autoload did not register the tpu device module"
x = torch.arange(6, dtype=torch.float32)
f = torch.compile(lambda a: torch.sin(a) * 2 + 1, backend="tpu")
assert torch.allclose(f(x), torch.sin(x) * 2 + 1, atol=1e-6)
t = torch.ones(3, device="tpu") + 1
assert t.cpu().tolist() == [2.0, 2.0, 2.0]
print("ok", torch_tpu.__file__)
"""


def test_installed_wheel_imports_torch_and_compiles(wheel, tmp_path):
    fresh_python = _fresh_environment(tmp_path / "env", wheel)
    site = subprocess.run([str(fresh_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
    proc = subprocess.run([str(fresh_python), "-c", f"SITE = {site!r}\n" + _SMOKE], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the installed wheel failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert proc.stdout.startswith("ok"), proc.stdout

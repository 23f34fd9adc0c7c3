"""Package discovery for the one `torch_tpu` distribution (everything else is in
pyproject.toml).

The distribution maps four folders into one import tree (pyproject's `package-dir`):
python/torch_tpu -> torch_tpu, compiler/ -> torch_tpu.compiler, runtime/ ->
torch_tpu.runtime, tools/ -> torch_tpu.tools. A hand-kept package list once missed
`torch_tpu.distributed`, so the wheel broke `import torch` through the device's autoload:
every package under those roots is found here instead, and
test/python/test_packaging.py checks the built wheel against the source tree.
"""

from setuptools import find_packages, setup

# Import path -> folder, as in pyproject.toml's package-dir.
ROOTS = {
    "torch_tpu": "python/torch_tpu",
    "torch_tpu.compiler": "compiler",
    "torch_tpu.runtime": "runtime",
    "torch_tpu.tools": "tools",
}


def discover() -> list[str]:
    found = set(ROOTS)
    for name, folder in ROOTS.items():
        found.update(f"{name}.{sub}" for sub in find_packages(folder))
    return sorted(found)


setup(packages=discover())

"""Every environment variable torch_tpu reads, with its default and meaning, in one
table. `docs/reference/env.md` is generated from `ENV_VARS`.

This module imports nothing but the standard library, so every layer (compiler tools,
runtime, frontend) may read it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str | None
    help: str
    layer: str  # "runtime", "frontend", "compiler", "tools"

    def raw(self) -> str | None:
        return os.environ.get(self.name, self.default)


ENV_VARS: dict[str, EnvVar] = {}


def declare(name: str, default: str | None, help: str, layer: str) -> EnvVar:
    if name in ENV_VARS:
        raise ValueError(f"environment variable {name} declared twice")
    var = EnvVar(name, default, help, layer)
    ENV_VARS[name] = var
    return var


def get_str(name: str) -> str | None:
    return ENV_VARS[name].raw()


def get_bool(name: str) -> bool:
    value = ENV_VARS[name].raw()
    return value is not None and value.strip().lower() in {"1", "true", "yes", "on"}


def get_int(name: str) -> int | None:
    value = ENV_VARS[name].raw()
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def get_parsed(name: str, parse: Callable[[str], object]) -> object:
    value = ENV_VARS[name].raw()
    return None if value is None else parse(value)


# -- the table ------------------------------------------------------------------------
# Keep entries grouped by layer; each helper module reads its variables through get_*.
declare("TORCH_TPU_DEBUG", None, "Show Python tracebacks for internal errors in the command-line tools.", "tools")

"""XLA compile options: the same as jax.jit's for a one-device program (issue #17), and
CompileSpec.xla_options reach XLA whether they are debug options or build options."""

from __future__ import annotations

import numpy as np
import pytest
from torch_tpu.runtime import CompileSpec, _jaxlib

# jax's partitioner flags: it compiles every program for its SPMD partitioner; ours are
# one-partition programs (torch_tpu.spmd compiles its own way).
PARTITIONER_FLAGS = {"use_spmd_partitioning", "use_shardy_partitioner"}


def _build_options(options) -> dict[str, str]:
    build = options.executable_build_options
    fields = {name: str(getattr(build, name)) for name in dir(build)
              if not name.startswith("_") and not callable(getattr(build, name))}
    fields["debug_options"] = str(build.debug_options)
    fields["profile_version"] = str(options.profile_version)
    fields["num_replicas"] = str(options.num_replicas)
    fields["num_partitions"] = str(options.num_partitions)
    return fields


def test_compile_options_equal_jax_jits_but_for_the_partitioner():
    pytest.importorskip("jax")
    import jax
    from jax._src import compiler

    ours = _build_options(_jaxlib.compile_options(1, [0], ()))
    theirs = _build_options(
        compiler.get_compile_options(1, 1, device_assignment=np.array([[0]]), backend=jax.devices("cpu")[0].client)
    )
    differ = {name for name in ours.keys() | theirs.keys() if ours.get(name) != theirs.get(name)}
    assert differ <= PARTITIONER_FLAGS, {name: (ours.get(name), theirs.get(name)) for name in differ - PARTITIONER_FLAGS}


def test_build_option_overrides_go_on_the_build_options_and_the_rest_to_xla_flags():
    options = _jaxlib.compile_options(
        1, [0], (("exec_time_optimization_effort", "0.5"), ("xla_cpu_enable_fast_math", "false"))
    )
    assert options.executable_build_options.exec_time_optimization_effort == pytest.approx(0.5)
    assert [name for name, _ in options.env_option_overrides] == ["xla_cpu_enable_fast_math"]


def test_a_program_compiles_and_runs_with_a_build_option_override(client):
    import torch

    text = (
        "func.func @main(%a: tensor<3xf32>) -> tensor<3xf32> {\n"
        "  %0 = stablehlo.add %a, %a : tensor<3xf32>\n"
        "  return %0 : tensor<3xf32>\n}\n"
    )
    exe = client.compile(text, options=CompileSpec(xla_options=(("exec_time_optimization_effort", "-0.5"),)))
    (out,) = exe(torch.tensor([1.0, 2.0, 3.0]))
    assert out.tolist() == [2.0, 4.0, 6.0]

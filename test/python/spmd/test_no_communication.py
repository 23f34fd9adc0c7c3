"""SPMD programs that need no communication are valid programs (issue #11 item 7): a
per-device module without collectives, and sharded programs whose shardings need none
(batch-only, all replicated), run and equal the single-device result."""

from __future__ import annotations

import pytest
import torch
from spmd_helpers import trace
from spmd_models import sharded_module
from torch_tpu.compiler.context import make_context
from torch_tpu.compiler.outlined import NotOutlinedError, ValueRef, split_outlined
from torch_tpu.spmd import ShardedProgram, compile_spmd, prepare


def _mlp(x, w, b):
    return (torch.relu(torch.nn.functional.linear(x, w, b)) * 2,)


def _args():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 4, generator=g), torch.randn(6, 4, generator=g), torch.randn(6, generator=g)]


@pytest.mark.parametrize("thin", [True, False])
def test_compile_spmd_of_a_module_without_collectives(cpu8, thin):
    args = _args()
    program = compile_spmd(trace(lambda *a: _mlp(*a)[0], *args), 4, client=cpu8, thin=thin)
    if thin:
        assert [s.stage.kind for s in program.stages] == ["compute"]
        assert program.collective_fingerprints == []
    expected = _mlp(*args)[0]
    per_rank = program([list(args)] * 4)
    for rank in per_rank:
        torch.testing.assert_close(rank[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("thin", [True, False])
@pytest.mark.parametrize("shardings", ["batch_only", "all_replicated"])
def test_sharded_program_that_needs_no_collectives(cpu8, thin, shardings):
    args = _args()
    arg_shardings = {"batch_only": [("x", None), None, None], "all_replicated": [None, None, None]}[shardings]
    result_shardings = {"batch_only": [("x", None)], "all_replicated": [None]}[shardings]
    module = sharded_module(_mlp, args, arg_shardings, result_shardings, 4)
    program = ShardedProgram(module, client=cpu8, thin=thin)
    assert "all_reduce" not in program.partitioned_text and "all_gather" not in program.partitioned_text
    (got,) = program(*args)
    torch.testing.assert_close(got, _mlp(*args)[0], rtol=1e-5, atol=1e-5)


def test_split_outlined_of_a_function_without_collectives_is_one_compute_stage():
    args = _args()
    module = prepare(trace(lambda *a: _mlp(*a)[0], *args), thin=True)
    program = split_outlined(module.operation)
    assert [s.kind for s in program.stages] == ["compute"]
    assert program.stages[0].args == tuple(ValueRef(-1, i) for i in range(3))
    assert len(program.outputs) == 1 and program.outputs[0].stage == 0


def test_split_outlined_still_rejects_collectives_that_were_not_outlined():
    text = """
    func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = "stablehlo.all_reduce"(%x) ({
        ^bb0(%a: tensor<f32>, %b: tensor<f32>):
          %s = stablehlo.add %a, %b : tensor<f32>
          stablehlo.return %s : tensor<f32>
      }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }
    """
    from torch_tpu.compiler.context import ir

    with make_context():
        module = ir.Module.parse(text)
    with pytest.raises(NotOutlinedError, match="run torchtpu-outline-collectives first"):
        split_outlined(module.operation)

"""torchtpu-insert-collectives end to end: the per-device program, run as N replicas on
virtual devices, computes what the single-device program computes (forward and backward
of an FSDP MLP, a tensor-parallel MLP and a tensor-parallel transformer block). The
reference is PyTorch eager on CPU; tolerances are float32 reassociation (partial sums
are added in a different order than one device adds them)."""

from __future__ import annotations

import re

import pytest
import torch
from spmd_models import (
    FSDP_ARGS,
    FSDP_RESULTS,
    TP_BLOCK_ARGS,
    TP_BLOCK_RESULTS,
    TP_MLP_ARGS,
    TP_MLP_RESULTS,
    block_args,
    block_step,
    expected,
    mlp_args,
    mlp_step,
    sharded_module,
)
from torch_tpu.compiler.context import ir, make_context
from torch_tpu.compiler.diagnostics import DiagnosticEngine
from torch_tpu.compiler.outlined import split_outlined
from torch_tpu.compiler.pipeline import run_pipeline
from torch_tpu.spmd import ShardedProgram, compile_spmd, spmd_safe

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _collectives(text: str) -> list[str]:
    return re.findall(r'"stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all|collective_permute)"', text)


def _check(program, args, step):
    for got, want in zip(program(*args), expected(step, args)):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("n", [4, 8])
def test_fsdp_mlp_forward_backward(cpu8, n):
    args = mlp_args()
    program = ShardedProgram(sharded_module(mlp_step, args, FSDP_ARGS, FSDP_RESULTS, n), client=cpu8, thin=False)
    kinds = _collectives(program.partitioned_text)
    # parameters all-gathered before use, the four gradients reduce-scattered, the loss all-reduced
    assert kinds.count("reduce_scatter") == 4 and kinds.count("all_reduce") == 1
    assert kinds.count("all_gather") >= 4
    assert f"%arg0: tensor<{64 // n}x16xf32>" in program.partitioned_text  # the local batch
    _check(program, args, mlp_step)


def test_tp_mlp_forward_is_one_all_reduce(cpu8):
    args = mlp_args()
    forward = ShardedProgram(sharded_module(mlp_step, args, TP_MLP_ARGS, TP_MLP_RESULTS, 4, forward_only=True),
                             client=cpu8, thin=False)
    # column-parallel then row-parallel: one all-reduce (of the [64, 16] output: the loss
    # needs it whole), nothing else
    assert _collectives(forward.partitioned_text) == ["all_reduce"]
    torch.testing.assert_close(forward(*args)[0], expected(mlp_step, args)[0], **TOL)
    program = ShardedProgram(sharded_module(mlp_step, args, TP_MLP_ARGS, TP_MLP_RESULTS, 4), client=cpu8, thin=False)
    _check(program, args, mlp_step)


def test_tp_transformer_block_thin_and_embedded(cpu8):
    args = block_args()
    module_text = str(sharded_module(block_step, args, TP_BLOCK_ARGS, TP_BLOCK_RESULTS, 4))
    embedded = ShardedProgram(module_text, client=cpu8, thin=False)
    kinds = _collectives(embedded.partitioned_text)
    # forward: after attention and after the MLP; backward: the residual stream's gradient
    assert kinds == ["all_reduce"] * 3, kinds
    _check(embedded, args, block_step)
    thin = ShardedProgram(module_text, client=cpu8, thin=True)
    assert len(thin.program.collective_fingerprints) == 3
    # Thin modules are compiled apart, so XLA fuses (and reassociates) differently than
    # in the embedded program: equal up to float32 rounding (2.3e-6 seen), not bit-exact.
    for a, b in zip(thin(*args), embedded(*args)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with spmd_safe():
        assert ShardedProgram(module_text, client=cpu8).program.thin is False
    assert ShardedProgram(module_text, client=cpu8).program.thin is True


def _outlined(text: str):
    with make_context():
        module = ir.Module.parse(text)
        engine = DiagnosticEngine()
        assert run_pipeline(module.operation, "builtin.module(torchtpu-outline-collectives)", engine), engine.format()
        return split_outlined(module.operation)


def test_collective_modules_identical_across_ranks():
    """Two ranks whose programs differ around the collectives (other compute, a
    collective earlier in one of them with another channel) compile byte-identical
    modules for the collectives they share."""
    reduce = """
      %{o} = "stablehlo.all_reduce"(%{i}) <{{channel_handle = #stablehlo.channel_handle<handle = {h}, type = 1>,
          replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, use_global_device_ids}}> ({{
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %s = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %s : tensor<f32>
      }}) : (tensor<8xf32>) -> tensor<8xf32>"""
    rank0 = ("func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {\n  %0 = stablehlo.multiply %x, %x : tensor<8xf32>"
             + reduce.format(o=1, i=0, h=1) + "\n  return %1 : tensor<8xf32>\n}")
    rank1 = ("func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {\n  %0 = stablehlo.exponential %x : tensor<8xf32>"
             "\n  %c = stablehlo.constant dense<2.0> : tensor<8xf32>\n  %1 = stablehlo.add %0, %c : tensor<8xf32>"
             + reduce.format(o=2, i=1, h=7) + "\n  return %2 : tensor<8xf32>\n}")
    a, b = _outlined(rank0), _outlined(rank1)
    fa = [s.fingerprint for s in a.stages if s.kind == "collective"]
    fb = [s.fingerprint for s in b.stages if s.kind == "collective"]
    assert fa == fb and len(fa) == 1
    assert [s.fingerprint for s in a.stages if s.kind == "compute"] != [s.fingerprint for s in b.stages if s.kind == "compute"]


def test_spmd_safe_decorator_and_context(cpu8):
    text = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = "stablehlo.all_reduce"(%x) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %s = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %s : tensor<f32>
      }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<4xf32>) -> tensor<4xf32>
      %1 = stablehlo.multiply %0, %x : tensor<4xf32>
      return %1 : tensor<4xf32>
    }"""

    @spmd_safe
    def build():
        return compile_spmd(text, 4, client=cpu8)

    embedded, thin = build(), compile_spmd(text, 4, client=cpu8)
    assert embedded.thin is False and thin.thin is True
    assert [s.stage.kind for s in thin.stages] == ["collective", "compute"]
    inputs = [[torch.full((4,), float(r + 1))] for r in range(4)]
    for e, t, r in zip(embedded(inputs), thin(inputs), range(4)):
        torch.testing.assert_close(e[0], torch.full((4,), 10.0 * (r + 1)))
        torch.testing.assert_close(t[0], e[0])

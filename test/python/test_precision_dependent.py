"""`precision_dependent` (compiler/passes/set_precision.py): which programs the caches of
compiled graphs, eager plans and tpu_dist graphs key by the float32 matmul precision mode."""

from __future__ import annotations

import pytest
from torch_tpu.compiler.context import ir, make_context
from torch_tpu.compiler.passes.set_precision import precision_dependent


def _depends(body: str, args: str) -> bool:
    with make_context() as context:
        module = ir.Module.parse(f"func.func @main({args}) {{\n{body}\n}}", context)
        return precision_dependent(module.operation)


@pytest.mark.parametrize("element, expected", [("f32", True), ("complex<f32>", True), ("bf16", False),
                                               ("f16", False), ("i32", False)])
def test_a_product_depends_on_the_mode_for_float32_operands_only(element, expected):
    body = (f"%0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : "
            f"(tensor<2x2x{element}>, tensor<2x2x{element}>) -> tensor<2x2x{element}>\nreturn")
    assert _depends(body, f"%a: tensor<2x2x{element}>") is expected


@pytest.mark.parametrize("target, expected", [("tpu_custom_call", True), ("__gpu$xla.gpu.triton", True),
                                              ("mosaic_gpu_v2", True), ("Sharding", False),
                                              ("my_host_callback", False)])
def test_a_compiled_kernel_depends_on_the_mode(target, expected):
    # A Pallas kernel's products were traced under the mode and compiled inside the kernel:
    # a program holding its call must be compiled again when the mode changes.
    body = (f'%0 = stablehlo.custom_call @"{target}"(%a) : (tensor<8xf32>) -> tensor<8xf32>\nreturn')
    assert _depends(body, "%a: tensor<8xf32>") is expected


def test_elementwise_programs_do_not_depend_on_the_mode():
    assert not _depends("%0 = stablehlo.add %a, %a : tensor<8xf32>\nreturn", "%a: tensor<8xf32>")

"""compiler/ir: the StableHLO builders shared by lowerings and passes. It loads without
torch, builds `#stablehlo.dot<...>` through the bindings (the same attribute the text
form parses to), and picks the comparison type from the element type."""

from __future__ import annotations

import subprocess
import sys

import pytest
from torch_tpu.compiler import ir as build
from torch_tpu.compiler.context import ir, make_context


def test_importing_the_builders_loads_no_torch():
    code = "import sys, torch_tpu.compiler.ir; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.fixture
def block():
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            yield module


@pytest.mark.parametrize(
    "dims, text",
    [
        (([], [], [1], [0]), "#stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>"),
        (
            ([0], [0], [2], [1]),
            "#stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], "
            "lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]>",
        ),
    ],
)
def test_dot_dimension_numbers_equal_the_parsed_text(block, dims, text):
    assert build.dot_dimension_numbers(*dims) == ir.Attribute.parse(text)


def test_dot_general_infers_batch_then_free_dims(block):
    f32, f64 = ir.F32Type.get(), ir.F64Type.get()
    lhs = build.iota([4, 2, 3], 2, f32)
    rhs = build.iota([4, 3, 5], 1, f32)
    product = build.dot_general(lhs, rhs, batch=([0], [0]), contract=([2], [1]), element=f64, precision="HIGHEST")
    assert build.shape_of(product) == [4, 2, 5]
    assert build.element_type_of(product) == f64
    assert "precision = [HIGHEST, HIGHEST]" in str(product.owner)


@pytest.mark.parametrize(
    "element, kind",
    [
        (lambda: ir.F32Type.get(), "FLOAT"),
        (lambda: ir.IntegerType.get_signless(32), "SIGNED"),
        (lambda: ir.IntegerType.get_unsigned(8), "UNSIGNED"),
        (lambda: ir.IntegerType.get_signless(1), "UNSIGNED"),
        (lambda: ir.ComplexType.get(ir.F32Type.get()), "FLOAT"),
    ],
)
def test_compare_type_follows_the_element_type(block, element, kind):
    assert build.compare_type(element()) == kind


def test_splat_wraps_unsigned_and_reads_bool(block):
    u8, i1 = ir.IntegerType.get_unsigned(8), ir.IntegerType.get_signless(1)
    assert "dense<255>" in str(build.splat(-1, u8, [2]).owner)
    assert "dense<true>" in str(build.splat(7, i1).owner)
    less = build.compare(build.splat(1, u8, [2]), build.splat(-1, u8, [2]), "LT")
    assert "UNSIGNED" in str(less.owner) and build.shape_of(less) == [2]


def test_slice_and_concatenate_leave_whole_values_alone(block):
    x = build.iota([3, 4], 1, ir.IntegerType.get_signless(32))
    assert build.slice_in_dim(x, 1, 0, 4) == x
    assert build.concatenate([x], 0) == x
    part = build.slice_in_dim(x, 1, 1, 4, 2)
    assert build.shape_of(part) == [3, 2]
    assert build.shape_of(build.concatenate([x, part], 1)) == [3, 6]


def _execute(module) -> list[int]:
    """Runs `@main()` of `module` on XLA:CPU: its 0-d integer results."""
    import numpy as np
    from jaxlib import xla_client

    client = xla_client.make_cpu_client()
    exe = client.compile_and_load(str(module), xla_client.DeviceList((client.devices()[0],)), xla_client.CompileOptions())
    results = exe.execute_sharded([]).disassemble_into_single_device_arrays()
    return [int(np.asarray(per_device[0])) for per_device in results]


def _main(module, count: int, build_results) -> None:
    """Fills `module` with `@main() -> (count x tensor<i32>)` returning `build_results()`."""
    from torch_tpu.compiler.context import func

    scalar = ir.RankedTensorType.get([], ir.IntegerType.get_signless(32))
    fn = func.FuncOp("main", ir.FunctionType.get([], [scalar] * count))
    with ir.InsertionPoint(fn.add_entry_block()):
        func.ReturnOp(list(build_results()))


def test_while_loop_carries_its_values_until_cond_fails(block):
    i32 = ir.IntegerType.get_signless(32)
    # (i, total) = (0, 0); while i < 5: (i, total) = (i + 1, total + i)
    _main(block, 2, lambda: build.while_loop(
        [build.splat(0, i32), build.splat(0, i32)],
        lambda v: build.compare(v[0], build.splat(5, i32), "LT"),
        lambda v: [build.add(v[0], build.splat(1, i32)), build.add(v[1], v[0])],
    ))
    assert block.operation.verify()
    assert _execute(block) == [5, 10]


def test_fori_loop_counts_up_and_down_and_skips_an_empty_range(block):
    i32 = ir.IntegerType.get_signless(32)

    def results():
        one = build.splat(1, i32)
        assert build.fori_loop(3, 3, [one], lambda i, v: v) == [one]
        assert build.fori_loop(3, 5, [one], lambda i, v: v, step=-1) == [one]
        (up,) = build.fori_loop(0, 4, [one], lambda i, v: [build.add(v[0], v[0])])  # 1 * 2**4
        (down,) = build.fori_loop(4, 0, [one], lambda i, v: [build.add(v[0], i)], step=-2)  # 1 + 4 + 2
        return [up, down]

    _main(block, 2, results)
    assert block.operation.verify()
    assert _execute(block) == [16, 7]

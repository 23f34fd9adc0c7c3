"""`torch_tpu.register_lowering`: a lowering written in user code for the user's own custom op
(one whose implementation cannot be traced, so without the lowering it would run in eager)
compiles with no fallback and matches eager; its code keys the compile cache."""

from __future__ import annotations

import re

import pytest
import torch

import torch_tpu
from torch_tpu.program.fingerprint import FxGraphFingerprint
from torch_tpu.compiler.lowering import LOWERINGS


@torch.library.custom_op("torchtpu_userlowering::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    # numpy: not traceable, so only a lowering keeps it out of eager.
    return torch.from_numpy(x.numpy() + alpha * y.numpy())


@scaled_add.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


@torch.library.custom_op("torchtpu_userlowering::split_halves", mutates_args=())
def split_halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[-1] // 2
    return torch.from_numpy(x.numpy()[..., :n].copy()), torch.from_numpy(x.numpy()[..., n:] * 2)


@split_halves.register_fake
def _(x):
    n = x.shape[-1] // 2
    return x.new_empty(*x.shape[:-1], n), x.new_empty(*x.shape[:-1], x.shape[-1] - n)


def _register_scaled_add(edited: bool = False):
    """Registers the lowering of scaled_add; `edited`: a changed version of the same function."""
    from torch_tpu.compiler import ir as hlo

    register = torch_tpu.register_lowering(torch.ops.torchtpu_userlowering.scaled_add.default, dynamic="safe")
    if not edited:
        @register
        def lower_scaled_add(ctx, x, y, alpha):
            scale = hlo.splat(alpha, hlo.element_type_of(y), hlo.shape_of(y))
            return hlo.add(x, hlo.mul(y, scale))
    else:
        @register
        def lower_scaled_add(ctx, x, y, alpha):
            return x

    return lower_scaled_add


def test_a_user_lowering_compiles_the_op(user_table, monkeypatch):
    _register_scaled_add()
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()

    def f(x, y):
        return scaled_add(x.sin(), y, 0.25) * 2

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x, y), f(x, y))


def test_a_lowering_with_two_results_reads_the_context(user_table, monkeypatch):
    from torch_tpu.compiler import ir as hlo

    @torch_tpu.register_lowering(torch.ops.torchtpu_userlowering.split_halves)
    def lower_split_halves(ctx, x):
        n = ctx.result_shape(0)[-1]
        assert ctx.arg_meta(0).shape[-1] == 2 * n and ctx.result_dtype(1) == torch.float32
        last = len(hlo.shape_of(x)) - 1
        first = hlo.slice_in_dim(x, last, 0, n)
        second = hlo.slice_in_dim(x, last, n, 2 * n)
        two = hlo.splat(2.0, hlo.element_type_of(x), hlo.shape_of(second))
        return first, hlo.mul(second, two)

    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()

    def f(x):
        a, b = split_halves(x + 1)
        return a - b

    x = torch.randn(2, 6)
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x), f(x))


def test_an_op_that_has_a_lowering_is_refused(user_table):
    builtin = LOWERINGS[torch.ops.aten.add.Tensor]
    with pytest.raises(ValueError, match=r"torch_tpu.register_lowering: aten.add.Tensor has two lowerings: "
                       r"\S+compiler/lowering/elementwise.py:\d+ \(\S+\) \(family elementwise\) and "
                       rf"{re.escape(__file__)}:\d+ \(test_an_op_that_has_a_lowering_is_refused.<locals>.<lambda>\)"
                       r".*pass replace=True"):
        torch_tpu.register_lowering(torch.ops.aten.add.Tensor)(lambda ctx, x, y, alpha=1: x)
    assert LOWERINGS[torch.ops.aten.add.Tensor] is builtin
    with pytest.raises(TypeError, match="expected an operator such as torch.ops.mylib.my_op.default"):
        torch_tpu.register_lowering("mylib::op")


def test_another_rule_for_a_user_op_is_refused_unless_it_replaces(user_table):
    op = torch.ops.torchtpu_userlowering.scaled_add.default
    first = _register_scaled_add()

    def another_rule(ctx, x, y, alpha):
        return y

    with pytest.raises(ValueError, match=rf"scaled_add.default has two lowerings: {re.escape(__file__)}:\d+ "
                       rf"\(_register_scaled_add.<locals>.lower_scaled_add\) .* and {re.escape(__file__)}:\d+ "
                       r"\(test_another_rule_for_a_user_op_is_refused_unless_it_replaces.<locals>.another_rule\)"):
        torch_tpu.register_lowering(op)(another_rule)
    assert LOWERINGS[op].fn is first
    torch_tpu.register_lowering(op, replace=True)(another_rule)
    assert LOWERINGS[op].fn is another_rule and LOWERINGS[op].identity is not None


def test_a_refused_registration_registers_none_of_its_ops(user_table):
    split = torch.ops.torchtpu_userlowering.split_halves.default
    with pytest.raises(ValueError, match="aten.add.Tensor has two lowerings"):
        torch_tpu.register_lowering(split, torch.ops.aten.add.Tensor)(lambda ctx, *args: args[0])
    assert split not in LOWERINGS


def test_registering_again_replaces_and_rekeys_the_cache(user_table):
    gm = torch.fx.symbolic_trace(lambda x, y: torch.ops.torchtpu_userlowering.scaled_add.default(x, y, 0.5))
    first = _register_scaled_add()
    key = FxGraphFingerprint(gm, "").cache_fingerprint()
    second = _register_scaled_add()  # a re-run cell: same name, replaces the rule
    assert LOWERINGS[torch.ops.torchtpu_userlowering.scaled_add.default].fn is second is not first
    assert FxGraphFingerprint(gm, "").cache_fingerprint() == key  # same code, same program
    _register_scaled_add(edited=True)  # same name, other code
    assert FxGraphFingerprint(gm, "").cache_fingerprint() != key


def test_the_how_to_example_runs_as_written(user_table, monkeypatch):
    import re
    from pathlib import Path

    howto = Path(__file__).resolve().parents[3] / "docs/howto/write-a-lowering.md"
    (source,) = [b for b in re.findall(r"```python\n(.*?)```", howto.read_text(), re.DOTALL)
                 if "register_lowering" in b]
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()
    namespace = {"__name__": "howto_write_a_lowering"}
    exec(compile(source, str(howto), "exec"), namespace)  # asserts compiled == eager itself
    assert LOWERINGS[torch.ops.howto.scaled_add.default].fn is namespace["lower_scaled_add"]

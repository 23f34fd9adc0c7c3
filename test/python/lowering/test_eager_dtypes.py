"""Ops whose fake (meta) kernel and eager kernel disagree on the result dtype when the
operands' dtypes differ (`threshold_backward(int64 grad, float32 input, 0.5)`: meta
int64, eager float32). Traced graphs follow the meta kernel and the importer checks
lowerings against it, so such ops are rewritten while tracing
(decompositions.EAGER_RESULT_DTYPE); compiled results must have eager's dtype."""

import itertools

import pytest
import torch

from torch_tpu.compiler.lowering import LOWERINGS
from torch_tpu.compiler.lowering.decompositions import EAGER_RESULT_DTYPE

aten = torch.ops.aten

CALLS = {
    aten.huber_loss.default: lambda x, t, _: aten.huber_loss(x, t, 1, 0.5),
    aten.soft_margin_loss.default: lambda x, t, _: aten.soft_margin_loss(x, t.sign(), 1),
    aten.normal.Tensor_Tensor: lambda m, s, _: aten.normal(m, s.abs() * 0),  # std 0: the mean
    aten.threshold_backward.default: lambda g, x, t: aten.threshold_backward(g, x, 0.5),
    aten.mish_backward.default: lambda g, x, t: aten.mish_backward(g, x),
    aten.mse_loss_backward.default: lambda g, x, t: aten.mse_loss_backward(g, x, t, 1),
    aten.smooth_l1_loss_backward.default: lambda g, x, t: aten.smooth_l1_loss_backward(g, x, t, 1, 0.5),
    aten.soft_margin_loss_backward.default: lambda g, x, t: aten.soft_margin_loss_backward(g, x, t, 1),
}
MIXED = [
    (torch.int64, torch.float32, torch.float32),
    (torch.float64, torch.float32, torch.float32),
    (torch.float32, torch.float16, torch.float16),
    (torch.bfloat16, torch.float32, torch.float64),
    (torch.int32, torch.float16, torch.float16),
]


def test_every_rewritten_op_is_tested():
    assert set(CALLS) == set(EAGER_RESULT_DTYPE)


@pytest.mark.parametrize("dtypes", MIXED, ids=lambda d: "-".join(str(t).split(".")[1] for t in d))
@pytest.mark.parametrize("op", sorted(CALLS, key=str), ids=str)
def test_compiled_result_dtype_is_eagers(monkeypatch, op, dtypes):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    fn = CALLS[op]
    torch.manual_seed(0)
    g = (torch.randn(4, 3) * 3).to(dtypes[0])
    x = (torch.randn(4, 3) * 3).to(dtypes[1])
    t = (torch.randn(4, 3).sign() if op is aten.soft_margin_loss_backward.default else torch.randn(4, 3)).to(dtypes[2])
    try:
        expected = fn(g, x, t)
    except (RuntimeError, NotImplementedError) as err:
        pytest.skip(f"eager rejects these dtypes: {err}")
    torch._dynamo.reset()
    got = torch.compile(fn, backend="tpu", fullgraph=True)(g, x, t)
    assert got.dtype == expected.dtype
    tol = 1e-2 if torch.float16 in dtypes or torch.bfloat16 in dtypes else 1e-5
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def test_compiled_threshold_backward_of_an_integer_gradient():
    """The repro: the result is float32 (promotion), as in eager."""
    fn = lambda g, x: aten.threshold_backward(g, x, 0.5)  # noqa: E731
    g, x = torch.tensor([1, 2, 3, 4]), torch.tensor([0.1, 0.6, 0.4, 0.9])
    torch._dynamo.reset()
    got = torch.compile(fn, backend="tpu", fullgraph=True)(g, x)
    torch.testing.assert_close(got, fn(g, x), rtol=0, atol=0)
    assert got.dtype == torch.float32


_PAIRS = list(itertools.permutations([torch.int64, torch.float16, torch.float32, torch.float64], 2))


def _ops_with_lowerings():
    """Lowered functional ops whose first two arguments are tensors."""
    for op in LOWERINGS:
        schema = getattr(op, "_schema", None)
        if schema is None or schema.is_mutable or schema.name.endswith("_"):
            continue
        args = schema.arguments
        if len(args) >= 2 and str(args[0].type) == str(args[1].type) == "Tensor":
            yield op


def _simple_args(schema):
    """Values for the arguments after the two leading tensors (None: a tensor like the
    second), or None when one has a type this scan does not fill."""
    values = []
    for arg in schema.arguments[2:]:
        kind = str(arg.type)
        if arg.has_default_value():
            break
        if kind in ("Scalar", "number", "float"):
            values.append(0.5)
        elif kind == "int":
            values.append(1)
        elif kind == "bool":
            values.append(False)
        elif kind == "Tensor":
            values.append(None)
        else:
            return None
    return values


def test_meta_and_eager_dtypes_agree_for_every_other_op():
    """Scans the lowered ops on mixed dtypes: every op whose meta kernel
    gives another dtype than eager must be in EAGER_RESULT_DTYPE (a PyTorch upgrade
    may add or fix some; this names them)."""
    missing = set()
    for op in _ops_with_lowerings():
        rest = _simple_args(op._schema)
        if rest is None:
            continue
        for a, b in _PAIRS:
            g, x = (torch.rand(4) * 3 + 0.5).to(a), (torch.rand(4) * 3 + 0.5).to(b)
            args = [x.clone() if v is None else v for v in rest]
            try:
                eager = op(g, x, *args)
            except Exception:  # noqa: BLE001 - eager rejects these dtypes: nothing to match
                continue
            meta = op(g.to("meta"), x.to("meta"), *[v.to("meta") if isinstance(v, torch.Tensor) else v for v in args])
            eager_dtypes = [t.dtype for t in (eager if isinstance(eager, (tuple, list)) else [eager])]
            meta_dtypes = [t.dtype for t in (meta if isinstance(meta, (tuple, list)) else [meta])]
            if eager_dtypes != meta_dtypes and op not in EAGER_RESULT_DTYPE:
                missing.add(str(op))
    assert not missing, f"meta and eager result dtypes differ for {sorted(missing)}: add them to EAGER_RESULT_DTYPE"

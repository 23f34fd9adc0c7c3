"""Ops whose kernels PyTorch has for CPU and CUDA only, or whose decomposition in PyTorch's
table is wrong, on the tpu device: the margin losses (margin_losses.py), weight
normalization's backward and `nn.Embedding(max_norm=)` (parameter_norms.py), `F.rrelu`
(randomized_relu.py); in-place ops whose out-of-place form ATen names with another overload
(`pow_.Scalar` is `pow.Tensor_Scalar`), and out= forms whose decomposition takes no out
tensor (`reflection_pad1d_backward.grad_input`, reached by `torch.stft`'s backward). Each
case runs under TORCH_TPU_STRICT=1 (a CPU fallback fails it) against the same call on CPU,
values and gradients, eager and, where a graph holds the op, compiled."""

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def no_cpu_fallback(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")


def _both(fn, *inputs, grad=True, atol=1e-6, rtol=1e-5):
    """`fn(*inputs)` on CPU and on the device (float inputs requiring grad when `grad`),
    the output's squares summed and backpropagated: outputs and input gradients equal."""
    results = {}
    for device in ("cpu", "tpu"):
        args = [i.detach().to(device).requires_grad_(grad and i.is_floating_point()) for i in inputs]
        out = fn(*args)
        first = out[0] if isinstance(out, tuple) else out
        if grad:
            first.float().square().sum().backward()
        results[device] = (out, [a.grad for a in args if a.requires_grad])
    (cpu_out, cpu_grads), (tpu_out, tpu_grads) = results["cpu"], results["tpu"]
    torch.testing.assert_close(_to_cpu(tpu_out), cpu_out, atol=atol, rtol=rtol)
    for got, want in zip(tpu_grads, cpu_grads):
        torch.testing.assert_close(got.cpu(), want, atol=atol, rtol=rtol)
    return cpu_out


def _to_cpu(x):
    return tuple(_to_cpu(v) for v in x) if isinstance(x, tuple) else x.detach().cpu()


# Target rows with a -1 before their last position (PyTorch's decomposition summed the
# positions after it), repeated labels, a row of only labels, a row starting with -1.
MULTILABEL_TARGETS = torch.tensor([[3, 0, -1, 1, 2], [4, -1, 0, 0, 0], [1, 2, 3, 4, 0], [2, 2, -1, 3, 3],
                                   [-1, 1, 2, 3, 4]])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_ignores_the_positions_after_minus_one(reduction):
    x = torch.randn(5, 5, generator=torch.Generator().manual_seed(0))
    loss = _both(lambda a: F.multilabel_margin_loss(a, MULTILABEL_TARGETS.to(a.device), reduction=reduction), x)
    assert loss.shape == ((5,) if reduction == "none" else ())


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_of_one_sample(reduction):
    x = torch.randn(5, generator=torch.Generator().manual_seed(1))
    loss = _both(lambda a: F.multilabel_margin_loss(a, MULTILABEL_TARGETS[0].to(a.device), reduction=reduction), x)
    assert loss.shape == ()


def test_multilabel_margin_loss_in_bfloat16():
    # PyTorch's CPU kernel has no bfloat16: float32 on the same (rounded) values.
    x = torch.randn(5, 5, generator=torch.Generator().manual_seed(2)).bfloat16()
    want = F.multilabel_margin_loss(x.float(), MULTILABEL_TARGETS, reduction="none")
    got = F.multilabel_margin_loss(x.to("tpu"), MULTILABEL_TARGETS.to("tpu"), reduction="none")
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu().float(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multi_margin_loss_backward(p, weighted, reduction):
    gen = torch.Generator().manual_seed(3)
    x, weight = torch.randn(4, 6, generator=gen), torch.rand(6, generator=gen) + 0.5
    target = torch.tensor([0, 5, 2, 2])

    def loss(a):
        w = weight.to(a.device) if weighted else None
        return F.multi_margin_loss(a, target.to(a.device), p=p, margin=0.7, weight=w, reduction=reduction)

    _both(loss, x)


def test_multi_margin_loss_of_one_sample():
    x = torch.randn(6, generator=torch.Generator().manual_seed(4))
    _both(lambda a: F.multi_margin_loss(a, torch.tensor([2], device=a.device), reduction="none"), x)


def test_margin_losses_compiled():
    x = torch.randn(5, 5, generator=torch.Generator().manual_seed(5))

    @torch.compile(backend="tpu", fullgraph=True)
    def losses(a, t, c):
        return F.multilabel_margin_loss(a, t) + F.multi_margin_loss(a, c, p=2)

    torch._dynamo.reset()
    target, classes = MULTILABEL_TARGETS, torch.tensor([0, 4, 2, 1, 3])
    _both(lambda a: losses(a, target.to(a.device), classes.to(a.device)), x)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("api", ["parametrizations", "hook"])
def test_weight_norm_gradients(dim, api):
    def build(device):  # the hook form's module cannot be deep-copied: built twice
        torch.manual_seed(0)
        layer = nn.Conv1d(4, 6, 3)
        if api == "parametrizations":
            return nn.utils.parametrizations.weight_norm(layer, dim=dim).to(device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return nn.utils.weight_norm(layer.to(device), dim=dim)

    layer, tpu_layer = build("cpu"), build("tpu")
    x = torch.randn(2, 4, 9)
    want, got = layer(x), tpu_layer(x.to("tpu"))
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(layer.named_parameters(), tpu_layer.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_norm_interface_backward_matches_the_kernel(dtype):
    gen = torch.Generator().manual_seed(6)
    v, g = torch.randn(5, 3, 2, generator=gen).to(dtype), torch.rand(5, 1, 1, generator=gen).to(dtype) + 0.5
    w, norms = aten._weight_norm_interface(v, g, 0)
    grad_w = torch.randn(5, 3, 2, generator=gen).to(dtype)
    want = aten._weight_norm_interface_backward(grad_w, v, g, norms, 0)
    moved = [t.to("tpu") for t in (grad_w, v, g, norms)]
    got = aten._weight_norm_interface_backward(*moved, 0)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a.cpu(), b, atol=tol, rtol=tol)


@pytest.mark.parametrize("norm_type", [1.0, 2.0, 3.5])
def test_embedding_max_norm_renormalizes_the_looked_up_rows_in_place(norm_type):
    torch.manual_seed(0)
    table = nn.Embedding(10, 4, max_norm=1.2, norm_type=norm_type)
    with torch.no_grad():
        table.weight[7] *= 0.1  # a looked-up row under max_norm: left as it is
    tpu_table = copy.deepcopy(table).to("tpu")
    indices = torch.tensor([[1, 2, 7], [2, 9, 1]])  # repeated rows; rows 0, 3-6, 8 not looked up
    want, got = table(indices), tpu_table(indices.to("tpu"))
    torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(tpu_table.weight.detach().cpu(), table.weight.detach(), atol=1e-6, rtol=1e-6)
    want.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(tpu_table.weight.grad.cpu(), table.weight.grad)


def test_embedding_max_norm_compiled_renormalizes_the_weight():
    """Under torch.compile the graph holds the functional `embedding_renorm`, whose result
    is written back into the weight."""
    torch.manual_seed(0)
    table = nn.Embedding(10, 4, max_norm=1.2)
    tpu_table = copy.deepcopy(table).to("tpu")
    torch._dynamo.reset()
    compiled = torch.compile(tpu_table, backend="tpu", fullgraph=True)
    indices = torch.tensor([[1, 2, 7], [2, 9, 1]])
    want, got = table(indices), compiled(indices.to("tpu"))
    torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(tpu_table.weight.detach().cpu(), table.weight.detach(), atol=1e-6, rtol=1e-6)


def test_embedding_renorm_with_no_indices_changes_nothing():
    weight = torch.randn(4, 3).to("tpu")
    before = weight.cpu()
    aten.embedding_renorm_(weight, torch.empty(0, dtype=torch.long, device="tpu"), 0.1, 2.0)
    torch.testing.assert_close(weight.cpu(), before)


def test_rrelu_in_evaluation_uses_the_mean_slope():
    x = torch.randn(40, generator=torch.Generator().manual_seed(7))
    _both(lambda a: F.rrelu(a, 0.1, 0.3, training=False), x)
    _both(lambda a: F.rrelu(a.clone(), 0.1, 0.3, training=False, inplace=True), x)


@pytest.mark.parametrize("inplace", [False, True])
def test_rrelu_in_training_draws_slopes_in_range(inplace):
    x = torch.randn(2000, generator=torch.Generator().manual_seed(8)).to("tpu").requires_grad_()
    source = x.clone() if inplace else x
    out = F.rrelu(source, 0.1, 0.3, training=True, inplace=inplace)
    out.sum().backward()
    value, grad, ref = out.detach().cpu(), x.grad.cpu(), x.detach().cpu()
    negative = ref <= 0
    slopes = value[negative] / ref[negative]
    assert slopes.min() >= 0.1 - 1e-6 and slopes.max() <= 0.3 + 1e-6 and slopes.std() > 0.03
    torch.testing.assert_close(value[~negative], ref[~negative])
    torch.testing.assert_close(grad[negative], slopes)  # the backward reads the noise drawn
    assert torch.all(grad[~negative] == 1)


def test_rrelu_in_training_compiled():
    """A compiled graph holds `rrelu_with_noise_functional` (slopes and noise as results):
    decomposed with the functional `uniform`, as the graph is already functional there."""
    torch._dynamo.reset()
    compiled = torch.compile(nn.RReLU(0.1, 0.3).train(), backend="tpu", fullgraph=True)
    x = torch.randn(2000, generator=torch.Generator().manual_seed(13)).to("tpu").requires_grad_()
    out = compiled(x)
    out.sum().backward()
    value, ref = out.detach().cpu(), x.detach().cpu()
    negative = ref <= 0
    slopes = value[negative] / ref[negative]
    assert slopes.min() >= 0.1 - 1e-6 and slopes.max() <= 0.3 + 1e-6 and slopes.std() > 0.03
    torch.testing.assert_close(x.grad.cpu()[negative], slopes)
    torch.testing.assert_close(value[~negative], ref[~negative])


@pytest.mark.parametrize("op", [
    lambda t, e: t.pow_(2), lambda t, e: t.pow_(e), lambda t, e: t.pow_(torch.tensor(2.0, device=t.device)),
    lambda t, e: t.floor_divide_(e), lambda t, e: t.floor_divide_(0.3), lambda t, e: t.ldexp_(e.round()),
    lambda t, e: t.double().float_power_(1.5), lambda t, e: t.double().float_power_(e.double()),
], ids=["pow_-scalar", "pow_-tensor", "pow_-0-dim", "floor_divide_", "floor_divide_-scalar", "ldexp_",
        "float_power_-scalar", "float_power_-tensor"])
def test_in_place_ops_whose_out_of_place_overload_has_another_name(op):
    gen = torch.Generator().manual_seed(9)
    x, e = torch.rand(6, generator=gen) + 0.5, torch.rand(6, generator=gen) + 0.5
    want = op(x.clone(), e)
    got = op(x.to("tpu"), e.to("tpu"))
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want)


def test_in_place_counterparts_take_the_same_arguments():
    from torch_tpu.compiler.importer.mutation import functional_counterpart

    assert functional_counterpart(aten.pow_.Scalar) is aten.pow.Tensor_Scalar
    assert functional_counterpart(aten.pow_.Tensor) is aten.pow.Tensor_Tensor
    assert functional_counterpart(aten.floor_divide_.Tensor) is aten.floor_divide.default
    assert functional_counterpart(aten.add_.Tensor) is aten.add.Tensor
    assert functional_counterpart(aten.polygamma_.default) is None  # (self, n) against (n, self)


@pytest.mark.parametrize("shape,pad", [((1, 2, 12), (3, 4)), ((2, 12), (5, 1)), ((1, 2, 6, 7), (1, 2, 3, 1))])
def test_reflection_padding_backward(shape, pad):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(10))
    _both(lambda a: F.pad(a, pad, mode="reflect"), x)


def test_stft_backward():
    x = torch.randn(200, generator=torch.Generator().manual_seed(11))
    _both(lambda a: torch.stft(a, 32, hop_length=8, window=torch.hann_window(32, device=a.device),
                               return_complex=True).abs(), x, atol=1e-4, rtol=1e-5)


def test_out_form_without_an_out_decomposition_resizes_its_out_tensor():
    gen = torch.Generator().manual_seed(12)
    x, grad = torch.randn(1, 2, 12, generator=gen), torch.randn(1, 2, 19, generator=gen)
    want = aten.reflection_pad1d_backward(grad, x, [3, 4])
    out = torch.empty(0, device="tpu")
    returned = aten.reflection_pad1d_backward.grad_input(grad.to("tpu"), x.to("tpu"), [3, 4], grad_input=out)
    assert returned is out and out.shape == want.shape
    torch.testing.assert_close(out.cpu(), want)
    stale = torch.zeros(5, device="tpu")
    with pytest.warns(UserWarning, match="was resized"):
        aten.reflection_pad1d_backward.grad_input(grad.to("tpu"), x.to("tpu"), [3, 4], grad_input=stale)
    torch.testing.assert_close(stale.cpu(), want)


SHIFT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", SHIFT_DTYPES, ids=str)
@pytest.mark.parametrize("op", [
    lambda a, b: a << b, lambda a, b: a >> b, lambda a, b: a << 3, lambda a, b: a >> 2,
    lambda a, b: torch.bitwise_left_shift(a, b), lambda a, b: torch.bitwise_right_shift(a, 70),
    lambda a, b: torch.bitwise_left_shift(5, b), lambda a, b: torch.bitwise_right_shift(-100, b),
], ids=["<<", ">>", "<<-scalar", ">>-scalar", "left_shift", "right_shift-too-far", "left_shift-of-number",
        "right_shift-of-number"])
def test_shifts(op, dtype):
    """Shift amounts in range, negative and past the width (0, or the sign for a signed
    right shift, as PyTorch's kernels give), in the promoted dtype."""
    a = torch.tensor([7, -12, 5, 3, -1, 100, 0, 1]).to(dtype)
    b = torch.tensor([0, 1, 3, 7, 8, 15, -1, 64]).to(dtype if dtype != torch.uint8 else torch.int16)
    want = op(a, b)
    got = op(a.to("tpu"), b.to("tpu"))
    assert got.dtype == want.dtype
    assert torch.equal(got.cpu(), want), (got, want)


@pytest.mark.parametrize("op", [
    lambda a, b: a.__ilshift__(2), lambda a, b: a.__irshift__(b), lambda a, b: a.bitwise_left_shift_(b),
    lambda a, b: a.bitwise_right_shift_(1),
], ids=["<<=", ">>=", "bitwise_left_shift_", "bitwise_right_shift_"])
def test_in_place_shifts(op):
    a, b = torch.tensor([7, -12, 5, 3], dtype=torch.int32), torch.tensor([1, 2, 0, 40], dtype=torch.int32)
    t = a.to("tpu")
    assert op(t, b.to("tpu")) is t
    assert torch.equal(t.cpu(), op(a.clone(), b))


def test_shifts_of_floats_raise_as_on_cpu(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_STRICT")
    with pytest.raises(RuntimeError, match="not implemented for 'Float'"):
        torch.tensor([1.0]) << 1
    with pytest.raises(RuntimeError, match="not implemented for 'Float'"):
        torch.tensor([1.0]).to("tpu") << 1


def test_cpu_fallback_takes_a_number_in_a_tensor_argument(monkeypatch):
    """PyTorch hands a Python kernel a wrapped number as the number; the CPU fallback gives
    the CPU kernel a tensor of the dtype promotion gives it (it raised "Expected a value of
    type 'Tensor'" for every op outside the few that take numbers)."""
    from torch_tpu.device import _fallback

    monkeypatch.delenv("TORCH_TPU_STRICT")
    cases = [
        (aten.bitwise_right_shift.Tensor, torch.tensor([7, -12, 5], dtype=torch.int32), 70),
        (aten.xlogy.Tensor, torch.tensor([1.5, 2.0], dtype=torch.float16), 3.0),
        (aten.xlogy.Tensor, torch.tensor([1, 2]), 3.0),
        (aten.xlogy.Tensor, torch.tensor(2.0, dtype=torch.bfloat16), 3),
    ]
    for op, x, number in cases:
        want = op(x, torch.tensor(number)) if op is aten.bitwise_right_shift.Tensor else torch.xlogy(x, number)
        got = _fallback.run_on_cpu(op, (x.to("tpu"), number), {}, "a test")
        assert got.device.type == "tpu" and got.dtype == want.dtype, (op, got.dtype, want.dtype)
        torch.testing.assert_close(got.cpu(), want)

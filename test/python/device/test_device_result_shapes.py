"""Eager results have CPU eager's shapes where PyTorch's meta kernel gives others (issue 30
item 8). The device plans each op's results from metadata; for these ops the meta kernel's
shapes differ from the CPU kernel's (batch norm's saved statistics in inference mode, the
auxiliary results of embedding_bag), so a metadata rule (compiler/lowering, `metadata_rule`)
gives CPU's. Every result is compared with CPU eager, shapes and values."""

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

aten = torch.ops.aten


def _check_like_cpu(op, *args):
    expected = op(*args)
    actual = op(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args])
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.device.type == "tpu"
        assert (a.shape, a.dtype) == (e.shape, e.dtype)
        torch.testing.assert_close(a.cpu(), e)


def _batch_norm_inputs():
    torch.manual_seed(0)
    return torch.randn(4, 3, 5), torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("op", [aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
                                aten._native_batch_norm_legit_functional.default], ids=str)
def test_batch_norm_saved_statistics(op, training):
    # In inference mode CPU returns save_mean/save_invstd of shape [0]; the meta kernel [C].
    x, weight, bias, mean, var = _batch_norm_inputs()
    if training and op is not aten._native_batch_norm_legit_functional.default:
        # The op writes its running stats: compare them too.
        cpu_mean, cpu_var = mean.clone(), var.clone()
        tpu_mean, tpu_var = mean.to("tpu"), var.to("tpu")
        expected = op(x, weight, bias, cpu_mean, cpu_var, True, 0.1, 1e-5)
        actual = op(x.to("tpu"), weight.to("tpu"), bias.to("tpu"), tpu_mean, tpu_var, True, 0.1, 1e-5)
        for a, e in zip((*actual, tpu_mean, tpu_var), (*expected, cpu_mean, cpu_var)):
            assert a.shape == e.shape
            torch.testing.assert_close(a.cpu(), e)
        return
    _check_like_cpu(op, x, weight, bias, mean, var, training, 0.1, 1e-5)


@pytest.mark.parametrize("op", [aten._native_batch_norm_legit_no_training.default, aten._batch_norm_no_update.default],
                         ids=str)
def test_inference_batch_norms_saved_statistics(op):
    _check_like_cpu(op, *_batch_norm_inputs(), 0.1, 1e-5)


def test_batch_norm_module_in_eval_mode():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(3)
    bn.running_mean.normal_()
    bn.eval()
    x = torch.randn(2, 3, 4, 4)
    expected = bn(x)
    torch.testing.assert_close(bn.to("tpu")(x.to("tpu")).cpu(), expected)


def _bag_inputs():
    torch.manual_seed(0)
    return torch.randn(10, 4), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4])


@pytest.mark.parametrize("op", [aten._embedding_bag.default, aten._embedding_bag_forward_only.default], ids=str)
@pytest.mark.parametrize("bag_mode", [0, 1, 2], ids=["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [-1, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_auxiliary_results(op, bag_mode, padding_idx, include_last_offset):
    # CPU: offset2bag empty on the fast path of mode='sum', one bag per index otherwise;
    # bag_size one entry per bag (per offset for the forward-only op in mode='sum'); max_indices bag_size's copy outside mode='max'. The meta
    # kernel gives offset2bag one entry per index always, bag_size one per offset, and
    # max_indices empty.
    weight, indices, offsets = _bag_inputs()
    if include_last_offset:
        offsets = torch.tensor([0, 4, 8])
    _check_like_cpu(op, weight, indices, offsets, False, bag_mode, False, None, include_last_offset, padding_idx)


@pytest.mark.parametrize("case", ["per_sample_weights", "float64", "strided_table", "int32_indices"])
def test_embedding_bag_fast_path_conditions(case):
    # What decides CPU's fast path (and so whether offset2bag is empty).
    weight, indices, offsets = _bag_inputs()
    weights = None
    if case == "per_sample_weights":
        weights = torch.randn(8)
    elif case == "float64":
        weight = weight.double()
    elif case == "strided_table":
        weight = weight.t().contiguous().t()
    else:
        indices, offsets = indices.int(), offsets.int()
    _check_like_cpu(aten._embedding_bag.default, weight, indices, offsets, False, 0, False, weights, False, -1)

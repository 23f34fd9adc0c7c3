"""dynamic=True / automatic dynamic shapes: compiled per static shape for now, with one
log line saying so, and correct at every size."""

import logging

import torch


def _f(x):
    return torch.nn.functional.softmax(x * 2, dim=-1).sum(0)


def test_dynamic_true_is_compiled_static(caplog):
    from torch_tpu import backend

    torch._dynamo.reset()
    backend._logged_static = False
    compiled = torch.compile(_f, backend="tpu", dynamic=True)
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        for n in (3, 5, 7, 5):
            x = torch.randn(n, 4)
            torch.testing.assert_close(compiled(x), _f(x))
    notes = [r for r in caplog.records if "dynamic=False is forced" in r.getMessage()]
    assert len(notes) == 1


def test_new_shapes_recompile_correctly():
    torch._dynamo.reset()
    compiled = torch.compile(_f, backend="tpu")
    for n in (2, 6, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), _f(x))

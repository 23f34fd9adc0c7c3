"""Dynamo does not compile torch_tpu's own frames when they run inside a compiled function
(an eager tpu op after a graph break: `print(t)`, DDP's hooks, a collective's Work)."""

from __future__ import annotations

import os

import torch

import torch_tpu
import torch_tpu.core
import torch_tpu.runtime
from torch_tpu.device import _dynamo_skip


def test_an_eager_tpu_op_after_a_graph_break_compiles_no_frame_of_torch_tpu(monkeypatch):
    import torch._dynamo.convert_frame as convert_frame
    from torch._dynamo.utils import counters

    compiled_files = []
    compile_code = convert_frame._compile

    def recording(code, *args, **kwargs):
        compiled_files.append(code.co_filename)
        return compile_code(code, *args, **kwargs)

    monkeypatch.setattr(convert_frame, "_compile", recording)
    x = torch.randn(8, device="tpu")

    @torch.compile(backend="eager")
    def f(x):
        y = x + 1
        shown = repr(y.sum() > 0)  # a graph break that runs tpu ops (to_host, item) in eager
        return y * 2, shown

    torch._dynamo.reset()
    counters.clear()
    for _ in range(3):
        out, shown = f(x)
    torch.testing.assert_close(out.cpu(), (x.cpu() + 1) * 2)
    assert shown in ("tensor(True, device='tpu:0')", "tensor(False, device='tpu:0')")
    # Before: 31 frames, 26 of them torch_tpu's kernels (to_host, _fast_signature, new_storage...).
    assert compiled_files and __file__ in compiled_files
    roots = tuple(os.path.dirname(m.__file__) for m in (torch_tpu, torch_tpu.runtime, torch_tpu.core))
    ours = [f for f in compiled_files if f.startswith(roots)]
    assert not ours, ours
    assert counters["frames"]["total"] < 10, dict(counters["frames"])


def test_only_functions_torch_tpu_defines_are_marked():
    import torch_tpu.device._ops as ops

    marked = _dynamo_skip._marked
    assert ops._fast_signature.__code__ in marked
    assert torch.add.__doc__ is not None  # a builtin: never walked
    # Functions torch_tpu imports from torch keep Dynamo's own treatment.
    from torch.utils._pytree import tree_map
    assert tree_map.__code__ not in marked
    _dynamo_skip.keep_dynamo_out()  # modules imported since the last call (other tests)
    assert _dynamo_skip.keep_dynamo_out() == 0  # marking twice marks nothing new

"""Which stack frame is the user's (python/torch_tpu/core/user_frames.py), and that every
place torch_tpu names the user's line asks that one policy: the compiler's FX locations,
the eager device's fallback errors and fused-program locations, and tpu_dist's
collective call sites."""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading

import numpy
import pytest
import torch
import torch._dynamo
import torch.nn.functional

import torch_tpu.compiler.fx_locations
import torch_tpu.device._ops
import torch_tpu.runtime
from torch_tpu.core import user_frames
from torch_tpu.core.user_frames import frames_of_trace, innermost_user, innermost_user_frame, is_user_file

TORCH_DIR = os.path.dirname(torch.__file__)


# -- files -------------------------------------------------------------------------------------
def test_a_users_file_is_the_users(tmp_path):
    assert is_user_file(__file__)
    assert is_user_file(str(tmp_path / "model.py"))
    # Folders named like ours are the user's: the rule compares package folders, not substrings.
    for folder in ("torch", "compiler", "runtime", "torch_tpu", "site-packages/mylib/torch"):
        assert is_user_file(str(tmp_path / folder / "model.py")), folder


@pytest.mark.parametrize("module", [torch.nn.functional, torch._dynamo.eval_frame, torch.fx.graph_module],
                         ids=lambda m: m.__name__)
def test_torch_internals_are_not(module):
    assert not is_user_file(module.__file__)


def test_a_wrapper_of_deprecated_torch_apis_is_not():
    # torch.distributed.all_gather_into_tensor is wrapped by typing_extensions.deprecated:
    # a collective's call site must be the user's line, not the wrapper's.
    import typing_extensions

    assert not is_user_file(typing_extensions.__file__)


@pytest.mark.parametrize("module", [torch_tpu.device._ops, torch_tpu.compiler.fx_locations, torch_tpu.runtime,
                                    user_frames], ids=lambda m: m.__name__)
def test_torch_tpu_internals_are_not(module):
    # From each top-level folder of a source checkout (python/, compiler/, runtime/).
    assert not is_user_file(module.__file__)


def test_the_standard_library_is_not_and_other_packages_are():
    assert not is_user_file(contextlib.__file__)
    assert not is_user_file(copy.__file__)
    # An installed package (a model library, a user's own package installed with pip)
    # holds the model's lines.
    assert is_user_file(numpy.__file__)


@pytest.mark.parametrize(
    "name, users",
    [
        ("<ipython-input-3-6f1d2a0c>", True),  # a notebook cell (older IPython)
        ("/tmp/ipykernel_4242/2871640364.py", True),  # a notebook cell (ipykernel writes cells to files)
        ("<stdin>", True),  # the interactive interpreter
        ("<eval_with_key>.3", False),  # FX's generated forward
        ("<string>", False),  # dataclass and namedtuple methods
        ("<frozen runpy>", False),
    ],
)
def test_pseudo_files(name, users):
    assert is_user_file(name) is users


# -- live stacks -------------------------------------------------------------------------------
def _torch_function(source: str):
    """A function whose code is torch's (as torch's dispatch, hooks or decorators sit
    between a user's line and torch_tpu): compiled under a file name in torch's folder."""
    namespace: dict = {}
    exec(compile(source, os.path.join(TORCH_DIR, "relay.py"), "exec"), namespace)
    return namespace["relay"]


RELAY = _torch_function("def relay(callback):\n    return callback()\n")


def _line_of(marker: str) -> int:
    with open(__file__) as source:
        return next(i for i, line in enumerate(source, 1) if line.rstrip().endswith(marker))


def test_the_innermost_user_frame_skips_torch_and_torch_tpu():
    where = RELAY(innermost_user_frame)  # users-line-1
    assert where == (__file__, _line_of("users-line-1"))


def test_a_dynamo_compiled_function_is_the_users():
    seen = []

    @torch._dynamo.disable
    def record():
        seen.append(innermost_user_frame(sys._getframe(1)))  # from the caller: Dynamo's wrapper

    def f(x):
        x = x + 1
        record()  # users-line-2
        return x * 2

    torch._dynamo.reset()
    torch.compile(f, backend="eager")(torch.ones(2))
    assert seen == [(__file__, _line_of("users-line-2"))]


def test_a_stack_without_user_frames():
    """A thread started from torch's code (as DDP's reducer runs collectives on the
    autograd thread): no frame is the user's."""
    from torch_tpu.distributed import _process_group

    relay = _torch_function("def relay(probes, out):\n    out.extend(probe() for probe in probes)\n")
    out: list = []
    thread = threading.Thread(target=relay, args=((innermost_user_frame, _process_group.user_frame), out))
    thread.start()
    thread.join()
    assert out[0] is None
    assert out[1][1] == 0 and "no Python frame" in out[1][0]
    assert innermost_user([(os.path.join(TORCH_DIR, "nn/modules/module.py"), 10), ("<eval_with_key>.1", 4)]) is None


# -- printed tracebacks (FX stack_trace) ----------------------------------------------------------
TRACE = f'''  File "/home/me/train.py", line 40, in <module>
    loss = model(x).sum()
  File "{TORCH_DIR}/nn/modules/module.py", line 1775, in _call_impl
    return forward_call(*args, **kwargs)
  File "/home/me/model.py", line 12, in forward
    return torch.relu(self.fc(x))
  File "{TORCH_DIR}/nn/modules/linear.py", line 134, in forward
    return F.linear(input, self.weight, self.bias)
'''


def test_a_printed_trace():
    frames = frames_of_trace(TRACE)
    assert frames[0] == ("/home/me/train.py", 40) and len(frames) == 4
    assert innermost_user(frames) == ("/home/me/model.py", 12)
    assert frames_of_trace(None) == [] and frames_of_trace("no frames") == []


# -- every caller asks the same policy -------------------------------------------------------------
def test_every_caller_names_the_same_line():
    from torch_tpu.device import _fallback, _fused
    from torch_tpu.distributed import _process_group

    expected = (__file__, _line_of("users-line-3"))
    found = RELAY(lambda: (_fused.user_frame(), _process_group.user_frame(), _fallback.user_line()))  # users-line-3
    # The lambda itself is the user's: each reports the lambda's line.
    assert found == (expected, expected, f"{expected[0]}:{expected[1]}")
    trace = f'  File "{expected[0]}", line {expected[1]}, in f\n' + TRACE.splitlines(keepends=True)[2]
    assert torch_tpu.compiler.fx_locations.user_frame(trace) == expected
    # With no user frame in a trace, the location is the innermost frame.
    internal = f'  File "{TORCH_DIR}/nn/modules/module.py", line 7, in f\n'
    assert torch_tpu.compiler.fx_locations.user_frame(internal) == (f"{TORCH_DIR}/nn/modules/module.py", 7)

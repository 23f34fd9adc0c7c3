"""What the bounded-dynamism tests share: a fresh Dynamo and L1 cache around each test, with
size 1 left symbolic, and the client's compile count."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.fx.experimental._config as fx_config

from torch_tpu.runtime import get_client


@contextlib.contextmanager
def fresh_dynamic_compiles() -> Iterator[None]:
    # Size 1 would otherwise be specialized by Dynamo (a second graph, a second compile).
    torch._dynamo.reset()
    get_client().cache.clear_l1()
    with fx_config.patch(backed_size_oblivious=True):
        yield
    torch._dynamo.reset()


def compiles() -> int:
    return get_client().cache.stats.compiles

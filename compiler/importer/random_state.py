"""The threaded RNG state of an imported function, shared by the graph importer and
`lower_op`: a `tensor<2xui64>` argument of the function, added on first use and advanced
by each `stablehlo.rng_bit_generator`. The caller feeds a fresh state per call (the
frontend's generator: PyTorch's for CPU tensors, the device's for tpu tensors)."""

from __future__ import annotations

import torch

from ..context import ir, stablehlo
from ..dtypes import tensor_type


class RandomState:
    def __init__(self, block: ir.Block | None = None) -> None:
        # The function's entry block; the graph importer sets it once the block exists.
        self.block = block
        self.state: ir.Value | None = None

    def random_bits(self, shape, bits: int) -> ir.Value:
        """Random `ui{bits}` values of `shape`, advancing the state."""
        state_type = tensor_type([2], torch.uint64)
        if self.state is None:
            self.state = self.block.add_argument(state_type, ir.Location.name("rng_state"))
        unsigned = {32: torch.uint32, 64: torch.uint64}[bits]
        algorithm = ir.Attribute.parse("#stablehlo<rng_algorithm DEFAULT>")
        op = stablehlo.RngBitGeneratorOp(state_type, tensor_type(list(shape), unsigned), algorithm, self.state)
        self.state = op.results[0]
        return op.results[1]

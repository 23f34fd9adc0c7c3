"""Compiled graphs with collectives in real `torchrun` jobs (2 processes, XLA:CPU): the
graph compiles whole, its collectives as thin stages of its program or embedded under
`torch_tpu.spmd_safe` (workers/compiled_collectives.py), and a compiled DDP step equals
single-process training."""

from __future__ import annotations

from test_tpu_dist import _expect_phases, torchrun


def test_compiled_graph_collectives_are_stages_of_one_program():
    out = torchrun(2, "--compiled-collectives", "--compiled-ddp")
    _expect_phases(out, range(2), ["compiled collectives", "spmd_safe compiled collectives", "compiled DDP", "JOB"])

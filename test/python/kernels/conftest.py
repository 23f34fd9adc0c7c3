"""The jax_ops these tests define add rules to the process's lowering table; tests
elsewhere count and document the built-in table (test_registry, test_docs, gendocs).
After each test module the jax_op rules are taken out again; an op traced later puts
its rule back (JaxOp.traced). Each test starts and ends with Dynamo's caches empty (the
same functions are compiled under different settings)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True, scope="module")
def _builtin_lowering_table_after_module():
    yield
    from torch_tpu.compiler.lowering.registry import LOWERINGS

    for op in [op for op, low in LOWERINGS.items() if low.family == "jax_op"]:
        del LOWERINGS[op]

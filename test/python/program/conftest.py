"""The jax_op the dump tests define adds a rule to the process's lowering table; tests
elsewhere count and document the built-in table (test_registry, test_docs), so after
each module the jax_op rules are taken out again, as test/python/kernels does (an op
traced later puts its rule back: JaxOp.traced)."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _builtin_lowering_table_after_module():
    yield
    from torch_tpu.compiler.lowering.registry import LOWERINGS

    for op in [op for op, low in LOWERINGS.items() if low.family == "jax_op"]:
        del LOWERINGS[op]

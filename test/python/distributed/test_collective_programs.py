"""The single-process pieces of tpu_dist: collective program text and handshake records."""

from __future__ import annotations

import numpy as np
import pytest

from torch_tpu.compiler.collective_programs import CollectiveProgramError, collective_module
from torch_tpu.runtime.distributed import CollectiveRecord, _mismatch_message, fingerprint_of


def test_program_text_depends_only_on_the_collective():
    a = collective_module("all_reduce", [8], "f32", 2, reduce_op="sum")
    assert a == collective_module("all_reduce", [8], "f32", 2, reduce_op="sum")
    assert "stablehlo.all_reduce" in a and "replica_groups = dense<[[0, 1]]>" in a
    assert "torchtpu" not in a and "loc(" not in a
    assert a != collective_module("all_reduce", [8], "f32", 4, reduce_op="sum")
    assert a != collective_module("all_reduce", [8], "f32", 2, reduce_op="max")


def test_xla_cpu_gaps_are_composed():
    broadcast = collective_module("broadcast", [8], "bf16", 4, src=2)
    assert "all_gather" in broadcast and "collective_broadcast" not in broadcast
    xor = collective_module("all_reduce", [8], "i32", 2, reduce_op="bxor")
    assert "stablehlo.xor" not in xor.split("all_reduce", 1)[1].split("}", 1)[0]  # bytes summed
    assert "ui8" in xor


def test_programs_run_as_replicas_with_the_right_values():
    from torch_tpu.runtime import Client, CompileSpec

    client = Client.create("cpu", num_cpu_devices=2)
    xs = [np.arange(6, dtype=np.int32) + 3 * r for r in range(2)]
    cases = {
        ("all_reduce", "bxor"): [xs[0] ^ xs[1]] * 2,
        ("broadcast", None): [xs[1]] * 2,
        ("all_gather", None): [np.concatenate(xs)] * 2,
        ("reduce_scatter", "sum"): list(np.split(xs[0] + xs[1], 2)),
        ("all_to_all", None): [np.concatenate([xs[0][:3], xs[1][:3]]), np.concatenate([xs[0][3:], xs[1][3:]])],
    }
    for (kind, op), want in cases.items():
        params = {"reduce_op": op} if op else {}
        if kind == "broadcast":
            params["src"] = 1
        exe = client.compile(collective_module(kind, [6], "i32", 2, **params), options=CompileSpec(num_replicas=2))
        outs = exe.execute_replicated([[xs[0]], [xs[1]]])
        for r in range(2):
            np.testing.assert_array_equal(outs[r][0].to_numpy(), want[r], err_msg=f"{kind} {op} replica {r}")


def test_float_bitwise_reduction_is_an_error():
    with pytest.raises(CollectiveProgramError, match="'band' is not defined for float"):
        collective_module("all_reduce", [4], "f32", 2, reduce_op="band")


def test_records_round_trip_and_mismatch_names_ranks_and_lines():
    rec = CollectiveRecord(1, 7, fingerprint_of("text", "all_reduce(3 x f32)"), "all_reduce(3 x f32)", "a.py:3")
    assert CollectiveRecord.decode(1, rec.encode()) == rec
    other = CollectiveRecord(0, 7, "ffff", "all_gather(3 x f32)", "a.py:9")
    message = _mismatch_message("0", 7, [other, rec])
    assert "diverged at collective #7" in message
    assert "rank 0: all_gather(3 x f32) at a.py:9" in message and "rank 1: all_reduce(3 x f32) at a.py:3" in message

"""Property: bounded dynamism never reads padding. For OpInfo samples (float32, int64,
bool where the op takes it), dims 0 and 1 of every input are marked dynamic — with a
bound above the size (`mark_dynamic(min=2, max=...)`) and without one (the policy bound)
— and the compiled result must equal eager, or the op must fall back to eager with the
fallback logged. A mismatch, or an error from the backend, fails.

To stay within about four minutes on two cores, CI runs a fixed seeded quarter of the
OpInfo ops plus the families of issues #11 and #19 (`ALWAYS`), one sample and one
(dtype, bound) configuration per op, both chosen by a seeded hash of the op's name.
TORCH_TPU_DYNAMIC_OPINFO_ALL=1 runs every op in every configuration. Running this file
as a script sweeps every op (or the ones named) and prints fallbacks and failures.

A mismatch that the static compile shows as well (no dynamic dim) is a static lowering's
difference, not padding; it is reported apart (`static_mismatches`) and not failed here.

The padding classes behind the results: compiler/lowering/registry.py `Padding`; the ops
that fall back: docs/reference/dynamic-fallbacks.md (generated)."""

from __future__ import annotations

import logging
import os
import random
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.fx.experimental._config as fx_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "opinfo"))
from opinfo_cases import as_function, compare, op_id, tolerances  # noqa: E402
from opinfo_xfail import FORWARD_XFAIL  # noqa: E402

DTYPES = (torch.float32, torch.int64, torch.bool)
# Ops whose values are unspecified or random: only metadata would compare.
SKIP = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
        "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.feature_alpha_dropout.without_train", "nn.functional.rrelu", "randint_like",
        "rand_like", "randn_like", "uniform", "normal", "normal.number_mean", "log_normal",
        "multinomial", "nn.functional.multi_head_attention_forward", "bernoulli", "cauchy",
        "exponential", "geometric", "randint", "randn", "rand"}
# Reassociation at the bound (XLA:CPU vs eager) on top of OpInfo's tolerances.
MIN_ATOL, MIN_RTOL = 1e-5, 1e-4


def _all_ops():
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if torch.float32 in op.supported_dtypes("cpu") and op_id(op) not in FORWARD_XFAIL
            and op_id(op) not in SKIP]


@dataclass
class Outcome:
    runs: int = 0
    matched: int = 0
    fell_back: dict[str, set] = field(default_factory=dict)  # op id -> ATen ops that fell back
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    static_mismatches: list[str] = field(default_factory=list)


class _FallbackLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.ops: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "cannot be compiled" in message:
            self.ops.add(message.split("torch_tpu: ", 1)[-1].split(" cannot be compiled", 1)[0])


def _mark(tensors, bounded: bool) -> bool:
    """Marks dims 0 and 1 (size >= 2) of every input dynamic; whether any was marked."""
    marked = False
    for t in tensors:
        for d in range(min(t.dim(), 2)):
            if t.shape[d] < 2:
                continue
            if bounded:
                torch._dynamo.mark_dynamic(t, d, min=2, max=2 * t.shape[d] + 3)
            else:
                torch._dynamo.mark_dynamic(t, d)
            marked = True
    return marked


def _is_backend_error(err: BaseException) -> bool:
    from torch._dynamo.exc import BackendCompilerFailed

    chain = err
    while chain is not None:
        if isinstance(chain, BackendCompilerFailed) or "torch_tpu" in type(chain).__module__:
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def run_sample(op, sample, dtype: torch.dtype, bounded: bool, outcome: Outcome) -> None:
    """One sample in one configuration: equal to eager, or a logged fallback."""
    from torch_tpu.backend import _compile

    fn, tensors = as_function(op, sample)
    if not tensors:
        outcome.skipped += 1
        return
    expected = fn(*[t.clone() for t in tensors])
    inputs = [t.clone() for t in tensors]
    if not _mark(inputs, bounded):
        outcome.skipped += 1
        return
    torch._dynamo.reset()
    _compile._reported_fallbacks.clear()
    handler = _FallbackLog()
    logger = logging.getLogger("torch_tpu")
    logger.addHandler(handler)
    name = f"{op_id(op)} {dtype} {'bounded' if bounded else 'unbounded'}"
    try:
        actual = torch.compile(fn, backend="tpu")(*inputs)
    except Exception as err:  # noqa: BLE001 - sorted below: ours fails, Dynamo's skips
        if _is_backend_error(err):
            detail = " ".join(line.strip() for line in str(err).splitlines()[:3] if line.strip())
            outcome.failures.append(f"{name}: {type(err).__name__}: {detail[:400]}")
        else:
            outcome.skipped += 1  # Dynamo cannot trace the sample with these marks
        return
    finally:
        logger.removeHandler(handler)
    outcome.runs += 1
    atol, rtol = tolerances(op)
    try:
        compare(actual, expected, max(atol, MIN_ATOL), max(rtol, MIN_RTOL))
    except AssertionError as err:
        if _static_mismatch(fn, tensors, expected, max(atol, MIN_ATOL), max(rtol, MIN_RTOL)):
            outcome.static_mismatches.append(name)  # not padding: the static lowering differs too
        else:
            outcome.failures.append(f"{name}: mismatch: {str(err).splitlines()[0][:300]}")
        return
    if handler.ops:
        outcome.fell_back.setdefault(op_id(op), set()).update(handler.ops)
    else:
        outcome.matched += 1


def _static_mismatch(fn, tensors, expected, atol: float, rtol: float) -> bool:
    """Whether the static compile (no dynamic dims) differs from eager as well: then the
    difference is the static lowering's (ties broken differently on int64 samples, say),
    reported apart from padding failures."""
    torch._dynamo.reset()
    try:
        actual = torch.compile(fn, backend="tpu", dynamic=False)(*[t.clone() for t in tensors])
        compare(actual, expected, atol, rtol)
    except Exception:  # noqa: BLE001 - any difference or failure counts
        return True
    return False


def _samples(op, dtype: torch.dtype, limit: int | None):
    if dtype not in op.supported_dtypes("cpu"):
        return []
    torch.manual_seed(0)
    try:
        found = []
        for sample in op.sample_inputs("cpu", dtype):
            if isinstance(sample.input, torch.Tensor):
                found.append(sample)
            if limit is not None and len(found) >= 4 * limit:
                break
    except Exception:  # noqa: BLE001 - OpInfo cannot make samples of this dtype
        return []
    rng = random.Random(zlib.crc32(f"{op_id(op)}{dtype}".encode()))
    return found if limit is None else rng.sample(found, min(limit, len(found)))


def configurations(op, everything: bool):
    """(dtype, bounded) pairs for `op`: all of them, or one fixed seeded choice per op."""
    pairs = [(dt, b) for dt in DTYPES for b in (True, False) if dt in op.supported_dtypes("cpu")]
    if everything:
        return pairs
    return [random.Random(zlib.crc32(op_id(op).encode())).choice(pairs)]


# Always in the CI subset: the families of issues #11 and #19.
ALWAYS = {"argmax", "argmin", "max.reduction_with_dim", "min.reduction_with_dim", "scatter", "scatter_add",
          "scatter_reduce.sum", "scatter_reduce.prod", "scatter_reduce.mean", "scatter_reduce.amax",
          "scatter_reduce.amin", "median", "nanmedian", "histc", "nn.functional.embedding_bag", "bucketize",
          "searchsorted", "nn.functional.scaled_dot_product_attention", "nn.functional.interpolate.nearest",
          "nn.functional.interpolate.bilinear", "nn.functional.upsample_nearest", "trunc", "mean", "var",
          "sum", "cumsum", "reshape", "flip", "index_select", "gather", "nn.functional.conv1d"}


def ci_ops(ops):
    """A fixed seeded quarter of the ops, plus ALWAYS (the whole list: ..._ALL=1)."""
    return [op for op in ops if op_id(op) in ALWAYS or zlib.crc32(op_id(op).encode()) % 4 == 0]


def sweep(ops, everything: bool, limit: int | None) -> Outcome:
    outcome = Outcome()
    with fx_config.patch(backed_size_oblivious=True):
        for op in ops:
            for dtype, bounded in configurations(op, everything):
                for sample in _samples(op, dtype, limit):
                    run_sample(op, sample, dtype, bounded, outcome)
    torch._dynamo.reset()
    return outcome


_EVERYTHING = os.environ.get("TORCH_TPU_DYNAMIC_OPINFO_ALL") == "1"


@pytest.mark.parametrize("shard", range(2))
def test_opinfo_samples_never_read_padding(shard, monkeypatch):
    monkeypatch.delenv("TORCH_TPU_STRICT", raising=False)
    ops = _all_ops() if _EVERYTHING else ci_ops(_all_ops())
    ops = ops[shard::2]
    outcome = sweep(ops, _EVERYTHING, None if _EVERYTHING else 1)
    assert outcome.runs > len(ops) // 2, (outcome.runs, len(ops))
    assert not outcome.failures, "\n".join(outcome.failures)


if __name__ == "__main__":
    import time

    logging.getLogger("torch_tpu").setLevel(logging.WARNING)
    logging.getLogger("torch_tpu").propagate = False
    chosen = [op for op in _all_ops() if not sys.argv[1:] or op_id(op) in sys.argv[1:]]
    start = time.time()
    result = Outcome()
    for one in chosen:
        print("OP", op_id(one), flush=True)
        part = sweep([one], everything=os.environ.get("EVERY", "1") == "1", limit=int(os.environ.get("LIMIT", "2")))
        for failure in part.failures:
            print("FAIL", failure, flush=True)
        result.runs += part.runs
        result.matched += part.matched
        result.skipped += part.skipped
        result.fell_back.update(part.fell_back)
        result.failures += part.failures
        result.static_mismatches += part.static_mismatches
        for mismatch in part.static_mismatches:
            print("STATIC", mismatch, flush=True)
    print(f"ops {len(chosen)} runs {result.runs} matched {result.matched} fell back "
          f"{sum(1 for _ in result.fell_back)} skipped {result.skipped} failures {len(result.failures)} "
          f"in {time.time() - start:.0f}s")
    for op, aten_ops in sorted(result.fell_back.items()):
        print("FALLBACK", op, sorted(aten_ops))
    for failure in result.failures:
        print("FAIL", failure)

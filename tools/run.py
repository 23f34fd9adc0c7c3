"""torchtpu-run: compiles a StableHLO module through torch_tpu's compile cache and runs it.

    torchtpu-run model.mlir --input a.npy --input-literal '2x3xf32=1,2,3,4,5,6' --print
    torchtpu-run model.mlir --input a.npy --replicas 4 -o out.npz
    torchtpu-run model.tpuexport --input ids.npy --input mask.npy

A saved export (a folder written by `torch_tpu.export(...).save(path)`, told by its
`export.json`) takes only the user's inputs, in the order of the module's arguments
(positional, then those exported as keywords); its weights come from the folder.

Inputs are the entry function's arguments in order, from `.npy` files (`--input`) or
inline (`--input-literal SHAPExTYPE=VALUES`, VALUES a comma-separated list in row-major
order, or one value for every element, e.g. `2x2xf32=1.5`, `i32=7`, `3xi1=true,false,true`).
With `--replicas N` every replica gets the same inputs, unless `--per-replica-inputs`
says they are listed replica by replica. Results are printed (`--print`, the default)
in a fixed format, or written to an `.npz` (`-o`). Exit status 0, or 1 with a one-line
error; never a traceback (TORCH_TPU_DEBUG=1 shows one for internal errors).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from typing import NoReturn

import numpy as np

PROG = "torchtpu-run"


class _Parser(argparse.ArgumentParser):
    """Usage errors are one-line errors with exit status 1, like every other error."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


class UsageError(Exception):
    """A user error: printed as one line, exit status 1."""


class _InputAction(argparse.Action):
    """Keeps --input and --input-literal in one list, in command-line order."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = getattr(namespace, "inputs", None) or []
        items.append(("file" if option_string == "--input" else "literal", values))
        namespace.inputs = items


def _arg_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Compile a StableHLO module (text or bytecode) through the torch_tpu compile "
        "cache and run it on a PjRT device.",
        allow_abbrev=False,
    )
    p.add_argument("module", help="input .mlir (text or bytecode) file, or a saved torch_tpu export folder")
    p.add_argument("--input", action=_InputAction, metavar="FILE.npy", help="an argument from a .npy file (repeatable)")
    p.add_argument(
        "--input-literal", action=_InputAction, metavar="SHAPExTYPE=VALUES",
        help="an inline argument, e.g. 2x3xf32=1,2,3,4,5,6 or i32=7 (repeatable)",
    )
    p.add_argument("--platform", choices=("cpu", "cuda", "gpu", "tpu"), default=None, help="PjRT platform (default: discovery / TORCH_TPU_PLATFORM)")
    p.add_argument("--replicas", type=int, default=1, metavar="N", help="run N replicas (default 1)")
    p.add_argument("--per-replica-inputs", action="store_true", help="inputs are listed replica by replica (N x arguments)")
    p.add_argument("--donate", default="", metavar="I,J", help="argument indices to donate (compile option)")
    p.add_argument("--print", dest="print_results", action="store_true", help="print the results (default unless -o)")
    p.add_argument("-o", dest="output", default=None, metavar="OUT.npz", help="write the results to an .npz file")
    p.add_argument("-v", "--verbose", action="store_true", help="say on stderr where the executable came from and how long it took")
    p.set_defaults(inputs=[])
    return p


# -- inputs -------------------------------------------------------------------------------


def _parse_literal(spec: str) -> np.ndarray:
    from torch_tpu.runtime import dtypes

    type_part, sep, values = spec.partition("=")
    if not sep:
        raise UsageError(f"--input-literal '{spec}': expected SHAPExTYPE=VALUES, e.g. 2x3xf32=1,2,3,4,5,6")
    match = re.fullmatch(r"((?:\d+x)*)(\S+)", type_part.strip())
    if match is None:
        raise UsageError(f"--input-literal '{spec}': bad type '{type_part}', expected e.g. 2x3xf32")
    dim_text = [d for d in match.group(1).split("x") if d]
    elem = match.group(2)
    try:
        shape = tuple(int(d) for d in dim_text)
    except ValueError:
        raise UsageError(f"--input-literal '{spec}': bad shape '{type_part}', expected e.g. 2x3xf32") from None
    if any(d < 0 for d in shape):
        raise UsageError(f"--input-literal '{spec}': negative dimension")
    try:
        row = dtypes.from_mlir(elem)
    except Exception as err:  # noqa: BLE001
        raise UsageError(f"--input-literal '{spec}': {err}") from None
    items = [v.strip() for v in values.split(",")] if values.strip() else []
    count = math.prod(shape)
    if len(items) == 1 and count != 1:
        items = items * count
    if len(items) != count:
        raise UsageError(f"--input-literal '{spec}': {count} values needed for shape {list(shape)}, got {len(items)}")
    try:
        if row.numpy == np.bool_:
            parsed = [_parse_bool(v) for v in items]
            data = np.array(parsed, dtype=np.bool_)
        elif row.numpy.kind == "c":
            data = np.array([complex(v.replace(" ", "")) for v in items], dtype=row.numpy)
        elif row.numpy.kind in "iu":
            data = np.array([int(v, 0) for v in items], dtype=np.int64 if row.numpy.kind == "i" else np.uint64)
            if data.size and (data.min() < np.iinfo(row.numpy).min or data.max() > np.iinfo(row.numpy).max):
                raise ValueError(f"value out of range for {elem}")
            data = data.astype(row.numpy)
        else:
            data = np.array([float(v) for v in items], dtype=np.float64).astype(row.numpy)
    except ValueError as err:
        raise UsageError(f"--input-literal '{spec}': {err}") from None
    return data.reshape(shape)


def _parse_bool(v: str) -> bool:
    low = v.lower()
    if low in ("true", "1"):
        return True
    if low in ("false", "0"):
        return False
    raise ValueError(f"'{v}' is not a boolean (true/false/1/0)")


def _load_input(path: str) -> np.ndarray:
    try:
        value = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"cannot read input '{path}': no such file") from None
    except ValueError as err:
        if "pickle" in str(err).lower():
            raise UsageError(f"input '{path}' holds pickled Python objects; only numeric .npy arrays are accepted") from None
        raise UsageError(f"cannot read input '{path}': {err}") from None
    except OSError as err:
        raise UsageError(f"cannot read input '{path}': {err.strerror or err}") from None
    if isinstance(value, np.lib.npyio.NpzFile):
        value.close()
        raise UsageError(f"input '{path}' is an .npz archive; pass one .npy file per argument")
    return value


def _inputs(items: list[tuple[str, str]]) -> list[tuple[str, np.ndarray]]:
    out = []
    for kind, text in items:
        if kind == "file":
            out.append((text, _load_input(text)))
        else:
            out.append((f"--input-literal '{text}'", _parse_literal(text)))
    return out


# -- printing -----------------------------------------------------------------------------


def _format_float(v: float, dtype: np.dtype) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    as_type = np.float64 if dtype == np.float64 else (np.float16 if dtype == np.float16 else np.float32)
    x = as_type(v)
    if x != 0 and (abs(x) >= 1e16 or abs(x) < 1e-5):
        return np.format_float_scientific(x, unique=True, trim="-")
    return np.format_float_positional(x, unique=True, trim="-")


def _scalar_formatter(dtype: np.dtype):
    if dtype == np.bool_:
        return lambda v: "true" if v else "false"
    if dtype.kind in "iu":
        return lambda v: str(int(v))
    if dtype.kind == "c":
        part = np.float64 if dtype == np.complex128 else np.float32

        def fmt_complex(v: complex) -> str:
            re_s = _format_float(float(v.real), np.dtype(part))
            im = float(v.imag)
            im_s = _format_float(abs(im), np.dtype(part)) if not math.isnan(im) else "nan"
            sign = "-" if (im < 0 or (im == 0 and math.copysign(1, im) < 0)) else "+"
            return f"({re_s}{sign}{im_s}j)"

        return fmt_complex
    return lambda v: _format_float(float(v), dtype)


def format_array(a: np.ndarray) -> str:
    """Row-major, numpy-like nesting, one innermost row per line, shortest round-trip
    numbers: `[[1, 2.5], [3, 4]]` -> two lines."""
    dtype = a.dtype
    if dtype.type.__module__.startswith("ml_dtypes"):
        a = a.astype(np.float32)
        fmt = _scalar_formatter(np.dtype(np.float32))
    else:
        fmt = _scalar_formatter(dtype)
    if a.ndim == 0:
        return fmt(a[()])

    def rec(x: np.ndarray, depth: int) -> str:
        if x.ndim == 1:
            return "[" + ", ".join(fmt(v) for v in x.tolist()) + "]"
        sep = "," + "\n" * (x.ndim - 1) + " " * (depth + 1)
        return "[" + sep.join(rec(sub, depth + 1) for sub in x) + "]"

    return rec(a, 0)


# -- main ---------------------------------------------------------------------------------


def run(argv: list[str]) -> int:
    args = _arg_parser().parse_args(argv)
    if args.replicas < 1:
        raise UsageError(f"--replicas {args.replicas}: must be at least 1")
    import torch_tpu

    if torch_tpu.is_saved_export(args.module):
        return _run_saved_export(args)
    try:
        with open(args.module, "rb") as f:
            data = f.read()
    except OSError as err:
        raise UsageError(f"cannot read '{args.module}': {err.strerror or err}") from None
    name = os.path.basename(args.module)
    if not data.startswith(b"ML\xefR"):
        try:
            source: str | bytes = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"'{args.module}' is neither UTF-8 MLIR text nor MLIR bytecode") from None
    else:
        source = data
    try:
        donate = tuple(int(i) for i in args.donate.split(",") if i.strip())
    except ValueError:
        raise UsageError(f"--donate '{args.donate}': expected comma-separated argument indices") from None
    inputs = _inputs(args.inputs)

    from torch_tpu.core import config
    from torch_tpu.runtime import CompileSpec, TorchTPURuntimeError, get_client
    from torch_tpu.runtime.dtypes import type_string

    try:
        need = max(args.replicas, config.get("TORCH_TPU_NUM_CPU_DEVICES"))
        client = get_client(args.platform, num_cpu_devices=need)
        start = time.perf_counter()
        exe = client.compile(source, options=CompileSpec(num_replicas=args.replicas, donate_argnums=donate), name=name)
        elapsed = time.perf_counter() - start
    except TorchTPURuntimeError as err:
        raise UsageError(str(err).splitlines()[0]) from None
    if args.verbose:
        sys.stderr.write(f"{PROG}: executable from {exe.origin} in {elapsed * 1e3:.1f} ms ({client.platform})\n")

    nargs = exe.num_args
    per_replica = args.per_replica_inputs and args.replicas > 1
    expected = nargs * args.replicas if per_replica else nargs
    if len(inputs) != expected:
        what = f"{nargs} per replica x {args.replicas} replicas = {expected}" if per_replica else str(nargs)
        raise UsageError(
            f"{name}: @main takes {nargs} argument{'s' if nargs != 1 else ''} "
            f"{exe.signature.describe_args()}, got {len(inputs)} input{'s' if len(inputs) != 1 else ''} "
            f"(expected {what})"
        )
    for k, (label, value) in enumerate(inputs):
        spec = exe.signature.args[k % nargs] if nargs else None
        if spec is not None and value.dtype.kind == "V" and value.dtype.itemsize == spec.dtype.itemsize and spec.dtype.kind == "V":
            # NumPy writes bf16 / f8 (ml_dtypes) arrays to .npy as raw bytes ('|V2', '|V1')
            value = value.view(spec.dtype)
            inputs[k] = (label, value)
        if spec is not None and (value.dtype != spec.dtype or tuple(value.shape) != spec.shape):
            got = type_string(tuple(value.shape), value.dtype)
            raise UsageError(f"{name}: argument {k % nargs} ({label}): expected {spec}, got {got}")

    arrays = [v for _, v in inputs]
    try:
        if args.replicas == 1:
            results = [exe.execute(arrays)]
        else:
            per_device = [arrays[r * nargs : (r + 1) * nargs] for r in range(args.replicas)] if per_replica else [arrays] * args.replicas
            results = exe.execute_replicated(per_device)
        host = [[b.to_numpy() for b in replica] for replica in results]
    except TorchTPURuntimeError as err:
        raise UsageError(str(err).splitlines()[0]) from None

    _write_results(args, host)
    return 0


def _write_results(args, host: list[list[np.ndarray]]) -> None:
    from torch_tpu.runtime.dtypes import type_string

    if args.output:
        arrays_out = {}
        for r, replica in enumerate(host):
            for k, value in enumerate(replica):
                key = f"result{k}" if args.replicas == 1 else f"replica{r}_result{k}"
                if value.dtype.type.__module__.startswith("ml_dtypes"):
                    value = value.astype(np.float32)  # .npz has no bf16/f8: widened exactly
                arrays_out[key] = np.array(value)
        try:
            np.savez(args.output, **arrays_out)
        except OSError as err:
            raise UsageError(f"cannot write '{args.output}': {err.strerror or err}") from None
    if args.print_results or not args.output:
        out = sys.stdout
        for r, replica in enumerate(host):
            for k, value in enumerate(replica):
                prefix = "" if args.replicas == 1 else f"replica[{r}] "
                out.write(f"{prefix}result[{k}]: {type_string(tuple(value.shape), value.dtype)}\n")
                out.write(format_array(value) + "\n")
        out.flush()


def _run_saved_export(args) -> int:
    """Runs a saved export: weights from the folder, the user's inputs in argument order."""
    import torch
    import torch.utils._pytree as pytree

    import torch_tpu
    from torch_tpu.runtime import TorchTPURuntimeError, dtypes

    if args.replicas != 1 or args.per_replica_inputs or args.donate:
        raise UsageError("--replicas, --per-replica-inputs and --donate apply to .mlir modules, not to a saved export")
    if args.platform:
        os.environ["TORCH_TPU_PLATFORM"] = args.platform
    try:
        ep = torch_tpu.load(args.module)
    except torch_tpu.SavedExportError as err:
        raise UsageError(str(err)) from None
    tensor_leaves = [(a, k, leaf) for a in ep.signature.args for k, leaf in enumerate(a.leaves) if leaf.kind == "tensor"]
    inputs = _inputs(args.inputs)
    if len(inputs) != len(tensor_leaves):
        raise UsageError(
            f"{args.module}: the exported program takes {len(tensor_leaves)} input tensor(s) "
            f"{ep.describe()}, got {len(inputs)}"
        )
    values = iter(inputs)
    call_args, call_kwargs = [], {}
    for arg in ep.signature.args:
        leaves = []
        for leaf in arg.leaves:
            if leaf.kind == "constant":
                leaves.append(leaf.value)
                continue
            label, array = next(values)
            row = dtypes.from_torch(getattr(torch, leaf.dtype))
            if array.dtype.kind == "V" and array.dtype.itemsize == row.itemsize:
                array = array.view(row.numpy)  # bf16 / f8 .npy files hold raw bytes ('|V2')
            array = np.ascontiguousarray(array)
            if row.torch_view_as and array.dtype == row.numpy:
                # torch.from_numpy has no bf16/f8: through the same-width integer type
                tensor = torch.from_numpy(array.view(np.dtype(row.torch_view_as))).view(getattr(torch, row.torch_name))
            else:
                tensor = torch.from_numpy(array)
            leaves.append(tensor)
        value = pytree.tree_unflatten(leaves, pytree.treespec_loads(arg.tree))
        if arg.keyword:
            call_kwargs[arg.name] = value
        else:
            call_args.append(value)
    start = time.perf_counter()
    try:
        outputs = ep(*call_args, **call_kwargs)
    except (TypeError, ValueError) as err:
        raise UsageError(f"{args.module}: {err}") from None
    except TorchTPURuntimeError as err:
        raise UsageError(str(err).splitlines()[0]) from None
    if args.verbose:
        sys.stderr.write(f"{PROG}: ran {args.module} in {(time.perf_counter() - start) * 1e3:.1f} ms\n")
    host = []
    for leaf in pytree.tree_leaves(outputs):
        if not isinstance(leaf, torch.Tensor):
            leaf = torch.tensor(leaf)
        row = dtypes.from_torch(leaf.dtype)
        t = leaf.detach().cpu().contiguous()
        host.append(t.view(getattr(torch, row.torch_view_as)).numpy().view(row.numpy) if row.torch_view_as else t.numpy())
    _write_results(args, [host])
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # XLA logs its own errors (with C++ stack traces) before raising them to us; every
    # one reaches the user as our one-line message, so the tool keeps XLA quiet unless
    # TF_CPP_MIN_LOG_LEVEL says otherwise. Read when jaxlib loads (the runtime is
    # imported lazily, below).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        return run(argv)
    except UsageError as err:
        message = str(err)
        if ": error: " not in message.split("\n", 1)[0]:
            message = f"{PROG}: error: {message}"
        sys.stderr.write(message.splitlines()[0] + "\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        from torch_tpu.core import config

        if config.get("TORCH_TPU_DEBUG"):
            raise
        sys.stderr.write(
            f"{PROG}: internal error: {type(err).__name__}: {err} "
            "(please report this with the input file; TORCH_TPU_DEBUG=1 shows a traceback)\n"
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())

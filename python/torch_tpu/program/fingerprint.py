"""Compile-cache fingerprints of FX graphs, without printing MLIR.

The runtime's key is (shapeless, dims, options). Here the *shapeless* part is the
graph's structure with every integer literal masked out and the *dims* part is the
masked integers plus the input sizes, so the pair determines the graph exactly while
the shapeless hash stays the same across sizes.
"""

from __future__ import annotations

import torch
import torch.fx
import xxhash



class FxGraphFingerprint:
    """Implements the runtime's fingerprint protocol (`cache_fingerprint()`) for an
    ATen FX graph and the settings that change what we compile from it."""

    def __init__(self, gm: torch.fx.GraphModule, settings: str) -> None:
        self.gm = gm
        self.settings = settings
        self._cached: tuple[bytes, bytes] | None = None

    def cache_fingerprint(self) -> tuple[bytes, bytes]:
        if self._cached is None:
            self._cached = _fingerprint(self.gm, self.settings)
        return self._cached


def _fingerprint(gm: torch.fx.GraphModule, settings: str) -> tuple[bytes, bytes]:
    shapeless: list[str] = [settings]
    dims: list[int] = []
    index = {node: i for i, node in enumerate(gm.graph.nodes)}

    def encode(arg) -> str:
        if isinstance(arg, torch.fx.Node):
            return f"%{index[arg]}"
        if isinstance(arg, bool) or arg is None:
            return repr(arg)
        if isinstance(arg, int):
            dims.append(arg)
            return "#"
        if isinstance(arg, float):
            return repr(arg)
        if isinstance(arg, (list, tuple)):
            inner = ",".join(encode(a) for a in arg)
            return f"[{inner}]" if isinstance(arg, list) else f"({inner})"
        if isinstance(arg, dict):
            return "{" + ",".join(f"{k}:{encode(v)}" for k, v in sorted(arg.items())) + "}"
        if isinstance(arg, slice):
            return f"slice({encode(arg.start)},{encode(arg.stop)},{encode(arg.step)})"
        if isinstance(arg, torch.device):
            return "device"  # placement is decided by torch_tpu, not by the graph
        return f"{type(arg).__name__}:{arg}"

    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            if isinstance(val, torch.Tensor):
                shapeless.append(f"in:{val.dtype}:{val.dim()}")
                # A symbolic size keys by its expression: int() on it would specialize it.
                symbolic = [str(s) for s in val.shape if isinstance(s, torch.SymInt) and not s.node.is_constant()]
                if symbolic:
                    shapeless.append("sym:" + ",".join(symbolic))
                dims.extend(int(s) if not isinstance(s, torch.SymInt) or s.node.is_constant() else -1 for s in val.shape)
            elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) and not val.node.is_constant():
                # A size passed in as a value (`trunc: Sym(TruncToInt(1.7*ToFloat(s0)))`
                # from an eager partition) keys by its expression too: the bounds of
                # every size derived from it (an upsample's output) follow from it, and
                # two graphs that differ only there (scale 1.7 vs 2.5) are two programs.
                shapeless.append(f"in:{type(val).__name__}:{val.node.expr}")
            else:
                shapeless.append(f"in:{type(val).__name__}")
            continue
        if node.op == "get_attr":
            attr = gm
            for part in str(node.target).split("."):
                attr = getattr(attr, part)
            if isinstance(attr, torch.Tensor):
                data = attr.detach().cpu().contiguous()
                digest = xxhash.xxh3_64_hexdigest(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
                shapeless.append(f"const:{data.dtype}:{data.dim()}:{digest}")
                dims.extend(int(s) for s in data.shape)
            continue
        target = node.target if isinstance(node.target, str) else getattr(node.target, "__qualname__", None) or str(node.target)
        if hasattr(node.target, "name") and callable(node.target.name):
            target = node.target.name()
        shapeless.append(f"{node.op}:{target}:{encode(node.args)}:{encode(dict(node.kwargs))}{_foreign_identity(node)}")
    return "\n".join(shapeless).encode(), ",".join(map(str, dims)).encode()


def _foreign_identity(node: torch.fx.Node) -> str:
    """A rule defined outside the compiler (a jax_op's StableHLO, a user's
    `register_lowering` rule) keys by what it lowers to: the toolchain fingerprint
    covers only the compiler's own code."""
    from torch_tpu.compiler.lowering.registry import OpRecord, lookup, lowering_identity

    if isinstance(node.target, str):
        return ""
    lowering = lookup(node.target)
    if lowering is None or lowering.identity is None:  # the compiler's own rules
        return ""

    identity = lowering_identity(OpRecord.of_node(node))
    return f":identity={identity}" if identity else ""

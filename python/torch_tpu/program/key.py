"""The one cache key of a program: what kind of program, what it was built from, and the
settings it was built with (the precision mode in force, a graph's other choices).

The runtime's compile cache keys by (shapeless, dims, options) (`runtime/fingerprint.py`);
`ProgramKey.fingerprint()` gives the first two, and the `CompileSpec` the third. A subject
that fingerprints itself (an FX graph: `_fingerprint.FxGraphFingerprint`, whose shapeless
part stays the same across sizes) keeps its split; any other subject is a value whose
`repr` is stable (op names, dtypes, shapes, digests of foreign lowerings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import xxhash


@runtime_checkable
class Fingerprinted(Protocol):
    """A subject that describes itself to the compile cache (the runtime's protocol)."""

    def cache_fingerprint(self) -> tuple[bytes, bytes]: ...


@dataclass(frozen=True)
class ProgramKey:
    """kind: which program kind (`KINDS`); subject: what the program was built from;
    settings: the choices it was built with, the precision mode first."""

    kind: str
    subject: Any
    settings: str = ""
    _digest: list = field(default_factory=list, compare=False, repr=False)

    def fingerprint(self) -> tuple[int, int]:
        """(shapeless, dims) for the runtime's cache; computed once."""
        if not self._digest:
            if _fingerprinted(self.subject):
                shapeless, dims = self.subject.cache_fingerprint()
                head = f"{self.kind}\0{self.settings}\0".encode()
                self._digest.append((xxhash.xxh3_64_intdigest(head + shapeless), xxhash.xxh3_64_intdigest(dims)))
            else:
                self._digest.append((xxhash.xxh3_64_intdigest(repr((self.kind, self.subject)).encode()),
                                     xxhash.xxh3_64_intdigest(self.settings.encode())))
        return self._digest[0]

    def memo(self) -> tuple:
        """The program cache's key: the subject itself where it is a hashable value (no
        hashing of its text per lookup: graph-argument programs and jax_ops on CPU tensors
        are looked up on every call), else its fingerprint."""
        if _fingerprinted(self.subject):
            return (self.kind, self.fingerprint(), self.settings)
        return (self.kind, self.subject, self.settings)

    def short_hash(self) -> str:
        """12 hex digits naming the program (dump folders)."""
        shapeless, dims = self.fingerprint()
        return xxhash.xxh3_64_hexdigest(f"{shapeless}|{dims}".encode())[:12]


def _fingerprinted(subject: Any) -> bool:
    # Value subjects (tuples, text) first: a protocol check costs ~100x a type check, and
    # the program cache is asked on every use of a graph-argument program or a jax_op.
    return not isinstance(subject, (tuple, str, bytes, int)) and isinstance(subject, Fingerprinted)


# The program kinds, each compiled through `compile_module` (the dump folder's prefix).
KINDS = (
    "fx_graph",       # torch.compile graphs (`_invoker.compile_fx`), the views path included
    "eager_op",       # the eager device's single-op plans (`device/_ops.py`)
    "graph_io",       # tpu tensors into and out of compiled graphs (`device/_graph_io.py`)
    "fused",          # FUSED-mode traces (`device/_fused.py`)
    "jax_op",         # a jax_op on CPU tensors (`kernels/_jax_op.py`)
    "export",         # torch_tpu.export programs (`exported/_export.py`)
    "dist_graph",     # compiled graphs with collectives in a tpu_dist job (`backend/_dist_graph.py`)
    "collective",     # tpu_dist's eager collective programs (`distributed/_process_group.py`)
    "spmd",           # torch_tpu.spmd programs (`spmd.py`)
    "sharded",        # torch_tpu.spmd.ShardedProgram's partitioning (`spmd.py`; then an spmd program)
)

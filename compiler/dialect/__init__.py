"""The `torchtpu` dialect, declared in Python (see spec.py for the declaration model)."""

from . import ops as _ops  # noqa: F401  (fills the table)
from . import collective_ops as _collective_ops  # noqa: F401  (fills the table)
from . import view_ops as _view_ops  # noqa: F401  (fills the table)
from .spec import DIALECT, TORCHTPU, OpSpec, make_ref_type, ref_tensor_type
from .verifier import verify_module

__all__ = ["DIALECT", "TORCHTPU", "OpSpec", "make_ref_type", "ref_tensor_type", "verify_module"]

"""torch_tpu's passes: one pass per module, registered on import."""

from . import set_precision, verify  # noqa: F401  (registration)
from . import annotate_bounds, materialize_bounds  # noqa: F401  (registration)
from . import insert_collectives, lower_collectives, outline_collectives  # noqa: F401  (registration)
from . import decompose_views, inverse_views  # noqa: F401  (registration)
from . import inline  # noqa: F401  (registration)
from .base import PASS_REGISTRY, Option, Pass, PassOptionError, register_pass

__all__ = ["PASS_REGISTRY", "Option", "Pass", "PassOptionError", "register_pass"]

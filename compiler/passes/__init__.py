"""torch_tpu's passes: one pass per module, declared here with the module that registers
it and imported when a pipeline first names it (`PassRegistry`)."""

from .base import PASS_REGISTRY, Option, Pass, PassOptionError, register_pass

_PASS_MODULES = {
    "torchtpu-annotate-bounds": "annotate_bounds",
    "torchtpu-decompose-views": "decompose_views",
    "torchtpu-elide-roundings": "elide_roundings",
    "torchtpu-inline": "inline",
    "torchtpu-insert-collectives": "insert_collectives",
    "torchtpu-inverse-views": "inverse_views",
    "torchtpu-lower-collectives": "lower_collectives",
    "torchtpu-materialize-bounds": "materialize_bounds",
    "torchtpu-narrow-iotas": "narrow_iotas",
    "torchtpu-narrow-opmath": "narrow_opmath",
    "torchtpu-outline-collectives": "outline_collectives",
    "torchtpu-set-precision": "set_precision",
    "torchtpu-unflatten-dots": "unflatten_dots",
    "torchtpu-verify": "verify",
}
for _argument, _module in _PASS_MODULES.items():
    PASS_REGISTRY.declare(_argument, f"{__name__}.{_module}")

__all__ = ["PASS_REGISTRY", "Option", "Pass", "PassOptionError", "register_pass"]

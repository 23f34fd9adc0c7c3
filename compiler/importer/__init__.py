"""FX (ATen) -> torchtpu + StableHLO importer."""

from ..dtypes import UnsupportedDtypeError, dtype_of, element_type, tensor_type
from .fx_importer import ImportedGraph, InputSpec, OutputSpec, import_graph, is_supported

__all__ = [
    "ImportedGraph", "InputSpec", "OutputSpec", "UnsupportedDtypeError", "dtype_of",
    "element_type", "import_graph", "is_supported", "tensor_type",
]

"""Fused MoE, from loops to Triton: the package every notebook of the series imports.

Importing it picks the runtime first (a CUDA GPU, or Triton's CPU interpreter), because Triton
reads that choice when kernels are defined.
"""
from . import runtime  # noqa: I001  (must come before any kernel module)

runtime.announce()

from . import (  # noqa: E402
    checkpoint,
    notebook,  # noqa: E402
    quant,
)
from .examples import worked_example  # noqa: E402
from .indexing import expert_moe_matmul, indexing_moe_matmul, intermediate_bytes  # noqa: E402
from .kernels.align import align_block_size  # noqa: E402
from .kernels.fp8_layer import fp8_moe_layer, fp8_moe_matmul  # noqa: E402
from .kernels.fused_kernel import fused_moe_kernel, fused_moe_matmul  # noqa: E402
from .kernels.sorted_kernel import sorted_moe_kernel  # noqa: E402
from .kernels.sorted_layer import sorted_moe_layer, sorted_moe_matmul  # noqa: E402
from .layer import moe_layer  # noqa: E402
from .loop import loop_moe_layer, loop_moe_matmul  # noqa: E402
from .parallel import expert_parallel_layer, tensor_parallel_layer  # noqa: E402
from .reference import error_text, reference_moe_layer, reference_moe_matmul, rel_error  # noqa: E402
from .routing import route  # noqa: E402
from .shapes import MODEL_SHAPES, ModelShape, get_shape, random_problem  # noqa: E402

notebook.install()      # inside Jupyter: a reader's mistake ends in a short message (see notebook.py)

__all__ = [
    "route", "loop_moe_matmul", "loop_moe_layer", "indexing_moe_matmul", "intermediate_bytes",
    "fused_moe_kernel", "fused_moe_matmul", "align_block_size", "sorted_moe_kernel",
    "sorted_moe_matmul", "sorted_moe_layer", "moe_layer", "reference_moe_matmul",
    "reference_moe_layer", "rel_error", "error_text", "worked_example", "MODEL_SHAPES", "ModelShape",
    "get_shape", "random_problem", "runtime", "expert_parallel_layer", "tensor_parallel_layer",
    "quant", "checkpoint", "fp8_moe_layer", "fp8_moe_matmul",
    "expert_moe_matmul",   # deprecated alias of indexing_moe_matmul, for the 0.1 releases
]
__version__ = "0.1.0"

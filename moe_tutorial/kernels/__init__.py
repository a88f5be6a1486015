"""The Triton kernels of Parts 3 and 4, the alignment that sorts pairs by expert, and their launch configurations.

Import :mod:`moe_tutorial` first: it picks the runtime (GPU, or Triton's CPU interpreter) before
any ``@triton.jit`` here runs.
"""

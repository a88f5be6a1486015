"""Why shard the experts: how many bytes of expert weights a model has, and how many each GPU holds.

Only the routed experts are counted: the tensors that expert parallelism splits. Attention,
embeddings and shared experts come on top (every GPU keeps its own copy or its own slice).
"""
from __future__ import annotations

from ..shapes import MODEL_SHAPES, ModelShape

#: MoE layers of each model (from its published configuration): layers minus the dense ones that
#: come first (DeepSeek-V3: 61 layers, the first 3 dense; DeepSeek-V2-Lite: 27, the first dense;
#: Kimi-K2: 61, the first dense).
MOE_LAYERS: dict[str, int] = {
    "Mixtral-8x7B": 32,
    "Qwen1.5-MoE-A2.7B": 24,
    "DeepSeek-V2-Lite": 26,
    "Qwen3-30B-A3B": 48,
    "DeepSeek-V3": 58,
    "Kimi-K2": 60,
}

#: An H200's memory in GB (10^9 bytes), NVIDIA's specification (141 GB of HBM3e).
H200_MEMORY_GB = 141.0


def expert_params_per_layer(shape: ModelShape) -> int:
    """Parameters of one layer's routed experts: ``E * (2I * K + K * I) = 3 * E * I * K``."""
    return 3 * shape.num_experts * shape.intermediate * shape.hidden


def expert_bytes(shape: ModelShape, itemsize: int = 2) -> int:
    """Bytes of all the model's routed experts (every MoE layer), ``itemsize`` bytes per weight."""
    if shape.name not in MOE_LAYERS:
        raise ValueError(f"shape: expected one of {', '.join(MOE_LAYERS)} (models whose layer count is known), "
                         f"got {shape.name!r}")
    return MOE_LAYERS[shape.name] * expert_params_per_layer(shape) * itemsize


def expert_bytes_per_gpu(shape: ModelShape, world_size: int, itemsize: int = 2) -> float:
    """Bytes of expert weights on each GPU when ``world_size`` GPUs share the experts evenly."""
    return expert_bytes(shape, itemsize) / world_size


def memory_table(world_sizes=(1, 2, 4, 8), itemsize: int = 2) -> list[dict]:
    """One row per model: ``{"model", "experts": E, "total_gb", world: GB per GPU, ...}``."""
    rows = []
    for name in MOE_LAYERS:
        shape = MODEL_SHAPES[name]
        row = {"model": name, "experts": shape.num_experts, "total_gb": expert_bytes(shape, itemsize) / 1e9}
        row.update({w: expert_bytes_per_gpu(shape, w, itemsize) / 1e9 for w in world_sizes})
        rows.append(row)
    return rows

"""Part 6: the MoE layer on several devices with torch.distributed (NCCL on GPUs, gloo on CPUs).

One idea per module:

* :mod:`.launch` starts N processes forming one group (CPU processes with gloo on a laptop,
  also from Jupyter), and :mod:`.rank_main` is what each of them runs;
* :mod:`.groups` checks that a group exists and that all ranks called with matching shapes;
* :mod:`.sharding` says which experts (or which columns of every expert) a rank holds;
* :mod:`.dispatch` moves the tokens to their experts' ranks and back, two ways: a fixed-capacity
  all-gather / reduce-scatter that never waits on the host, and the variable-split all-to-all;
* :mod:`.expert_parallel` is the layer built from them and Part 4's kernel;
* :mod:`.graphs` captures that layer in a CUDA graph and replays it with new routings;
* :mod:`.tensor_parallel` is the alternative: every expert split by columns, one all-reduce;
* :mod:`.memory` and :mod:`.cost` are the numbers: expert bytes per GPU, and a model of
  link time against compute;
* :mod:`.demos` holds the rank programs notebook 06 launches, :mod:`.bench` the GPU measurements
  of the host-synchronised exchange, :mod:`.exchange_bench` those of both exchanges under graph
  replay, :mod:`.results` reads them back.
"""
from .dispatch import METHODS, Dispatched, DispatchPlan, GatherPlan, combine, dispatch
from .expert_parallel import expert_parallel_layer, local_experts, local_moe_layer
from .groups import require_group
from .launch import launch
from .sharding import expert_range, experts_per_rank, intermediate_range, shard_experts, shard_intermediate
from .tensor_parallel import tensor_parallel_layer

__all__ = [
    "launch", "require_group", "experts_per_rank", "expert_range", "shard_experts", "intermediate_range",
    "shard_intermediate", "dispatch", "combine", "METHODS", "Dispatched", "DispatchPlan", "GatherPlan",
    "local_experts", "local_moe_layer",
    "expert_parallel_layer", "tensor_parallel_layer",
]

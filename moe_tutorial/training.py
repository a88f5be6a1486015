"""Part 8: an MoE layer that learns, on a task made here (nothing to download).

The task (:class:`ClusterTask`): tokens come from a few Gaussian clusters, and each cluster has a
target map of its own, ``y = tanh(W_c x)``. One layer whose experts each learn one cluster's map
fits it; a router that sends every token to the same two experts does not, since two experts
cannot hold four maps. So the router must learn where to send tokens, through the gradient
that reaches it: the router gradient dS of the backward, flowing on into the logits.

The model (:class:`TinyMoE`) is a router (a linear map to ``E`` logits, softmax, top-k,
renormalised) and the layer of :func:`moe_tutorial.layer.moe_layer`, with any of its
differentiable implementations ("indexing", "loop", or "sorted": Part 8's kernels).

Keeping the experts' load even, two ways (:func:`train`'s ``balance``):

* ``"aux"``, an auxiliary loss (Switch Transformer, GShard): ``alpha * E * sum_e f_e * P_e``, with
  ``f_e`` the share of pairs sent to expert e and ``P_e`` the mean router probability of e. It is
  smallest when both are uniform, and its gradient pushes probability away from busy experts;
  it also pulls on the main loss's gradient.
* ``"bias"``, DeepSeek-V3's loss-free balancing: a per-expert bias added to the scores for the
  top-k *choice* only (the weights still come from the unbiased softmax). After each step the
  bias of an expert above the mean load goes down by ``rate``, below the mean it goes up. No
  gradient is involved: the loss stays the task's own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .layer import moe_layer

#: The ways :func:`train` keeps the load even.
BALANCES = (None, "aux", "bias")


@dataclass(frozen=True)
class ClusterTask:
    """``centers [C, dim]`` of the clusters and ``maps [C, dim, dim]``: cluster c's target is
    ``tanh(maps[c] @ x)``."""

    centers: torch.Tensor
    maps: torch.Tensor
    weights: torch.Tensor         # [C]: how often each cluster is drawn

    @property
    def dim(self) -> int:
        return self.centers.shape[1]


def make_task(clusters: int = 4, dim: int = 16, seed: int = 0, skew: float = 2.0, dtype=torch.float64) -> ClusterTask:
    """A task of ``clusters`` clusters in ``dim`` dimensions, the same for a given seed everywhere.
    Cluster c is drawn ``skew`` times as often as cluster c + 1 (1: all equally often): an even
    load of the experts is then not what the data alone would give."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(clusters, dim, generator=g, dtype=torch.float64) * 1.5
    maps = torch.randn(clusters, dim, dim, generator=g, dtype=torch.float64) * dim ** -0.5
    weights = skew ** -torch.arange(clusters, dtype=torch.float64)
    return ClusterTask(centers.to(dtype), maps.to(dtype), weights / weights.sum())


def sample(task: ClusterTask, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x [n, dim], y [n, dim], cluster [n])``: n tokens drawn from the clusters (as ``task.weights`` says)."""
    cluster = torch.multinomial(task.weights, n, replacement=True, generator=generator)
    x = task.centers[cluster] + 0.5 * torch.randn(n, task.dim, generator=generator, dtype=task.centers.dtype)
    y = torch.tanh(torch.einsum("nij,nj->ni", task.maps[cluster], x))
    return x, y, cluster


class TinyMoE(torch.nn.Module):
    """A router and one MoE layer: ``E`` experts of intermediate size ``inter``, top-``topk``.

    ``forward(x, impl)`` returns ``(y [n, dim], topk_ids [n, topk], probs [n, E])``.
    """

    def __init__(self, dim: int = 16, inter: int = 32, num_experts: int = 8, topk: int = 2, seed: int = 0,
                 dtype=torch.float64):
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def param(*shape, scale):
            return torch.nn.Parameter((torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype))

        self.topk = topk
        self.router = param(num_experts, dim, scale=dim ** -0.5)
        self.w13 = param(num_experts, 2 * inter, dim, scale=dim ** -0.5)
        self.w2 = param(num_experts, dim, inter, scale=inter ** -0.5)
        self.register_buffer("bias", torch.zeros(num_experts, dtype=dtype))    # DeepSeek-V3's balancing bias

    def route(self, x: torch.Tensor):
        """``(topk_weights, topk_ids, probs)``: the top-k by probability plus bias, weights from the
        probabilities alone, renormalised (differentiable in the router)."""
        probs = torch.softmax(x @ self.router.T, dim=-1)
        ids = torch.topk(probs + self.bias, self.topk, dim=-1).indices
        weights = probs.gather(1, ids)
        return weights / weights.sum(dim=-1, keepdim=True), ids.to(torch.int32), probs

    def forward(self, x: torch.Tensor, impl: str = "indexing"):
        weights, ids, probs = self.route(x)
        return moe_layer(x, self.w13, self.w2, weights, ids, impl=impl), ids, probs


def expert_load(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The share of (token, slot) pairs each expert received, ``[E]`` float64, summing to 1."""
    counts = torch.bincount(ids.flatten().long().cpu(), minlength=num_experts).double()
    return counts / counts.sum()


@dataclass
class History:
    """What :func:`train` records: the loss of every step and the experts' load every step."""

    losses: list[float] = field(default_factory=list)
    loads: list[torch.Tensor] = field(default_factory=list)

    def load_matrix(self) -> torch.Tensor:
        """``[steps, E]``: each row one step's :func:`expert_load`."""
        return torch.stack(self.loads)


def train(model: TinyMoE, task: ClusterTask, *, steps: int = 300, batch: int = 256, lr: float = 1e-2,
          impl: str = "indexing", balance: str | None = "bias", aux_alpha: float = 1e-2, bias_rate: float = 1e-3,
          seed: int = 0) -> History:
    """Adam on the mean squared error, ``steps`` batches of ``batch`` tokens (seeded), ``balance``
    one of :data:`BALANCES`. Returns the :class:`History`."""
    if balance not in BALANCES:
        raise ValueError(f"balance: expected one of {BALANCES}, got {balance!r}")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    E = model.router.shape[0]
    dtype = model.w13.dtype
    history = History()
    for _ in range(steps):
        x, y, _ = sample(task, batch, g)
        x, y = x.to(dtype), y.to(dtype)
        out, ids, probs = model(x, impl)
        loss = torch.mean((out - y) ** 2)
        load = expert_load(ids, E)
        total = loss
        if balance == "aux":
            total = loss + aux_alpha * E * torch.sum(load.to(probs.dtype) * probs.mean(dim=0))
        opt.zero_grad()
        total.backward()
        opt.step()
        if balance == "bias":
            with torch.no_grad():
                model.bias += bias_rate * torch.sign(load.mean() - load).to(model.bias.dtype)
        history.losses.append(float(loss.detach()))
        history.loads.append(load)
    return history


def same_steps(task: ClusterTask, *, steps: int = 3, batch: int = 64, impls=("sorted", "indexing"), seed: int = 0,
               **model_kw) -> list[dict]:
    """Two copies of one model (fp32, the interpreter's dtype) trained on the same batches, one per
    implementation in ``impls``: per step, each loss and the largest relative difference between
    the two models' gradients, tensor by tensor."""
    models = [TinyMoE(seed=seed, dtype=torch.float32, **model_kw) for _ in impls]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    g = torch.Generator().manual_seed(seed)
    records = []
    for _ in range(steps):
        x, y, _ = sample(task, batch, g)
        x, y = x.float(), y.float()
        losses, grads = [], []
        for model, opt, impl in zip(models, opts, impls):
            out, _, _ = model(x, impl)
            loss = torch.mean((out - y) ** 2)
            opt.zero_grad()
            loss.backward()
            losses.append(float(loss.detach()))
            grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
            opt.step()
        diff = {n: float((grads[0][n] - grads[1][n]).norm() / grads[1][n].norm()) for n in grads[0]}
        records.append({"losses": losses, "grad_rel_diff": diff})
    return records

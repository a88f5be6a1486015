"""Part 8's MoE that learns (moe_tutorial/training.py) and its figures: the task, the balancing, the
comparison of two implementations on the same steps."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import pytest
import torch

from moe_tutorial import training
from moe_tutorial.figures import part8
from moe_tutorial.kernels.backward_kernel import expert_tile
from moe_tutorial.kernels.trainable_layer import saved_bytes


@pytest.fixture(scope="module")
def histories():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)            # tiny tensors: one thread is faster than two waiting on each other
    try:
        task = training.make_task()
        yield {str(b): training.train(training.TinyMoE(), task, balance=b, aux_alpha=0.05, bias_rate=0.01)
               for b in training.BALANCES}
    finally:
        torch.set_num_threads(threads)


def test_the_task_is_the_same_for_a_seed_and_draws_clusters_as_it_says():
    a, b = training.make_task(seed=3), training.make_task(seed=3)
    assert torch.equal(a.centers, b.centers) and torch.equal(a.maps, b.maps)
    _, _, cluster = training.sample(a, 20000, torch.Generator().manual_seed(0))
    share = torch.bincount(cluster, minlength=4).double() / 20000
    assert torch.allclose(share, a.weights, atol=0.02)


def test_it_learns_and_balancing_evens_the_load(histories):
    for h in histories.values():
        assert sum(h.losses[-50:]) / 50 < 0.02 * h.losses[0]
    busiest = {k: float(h.load_matrix()[-50:].mean(0).max()) * 8 for k, h in histories.items()}
    assert busiest["None"] > 2 > max(busiest["aux"], busiest["bias"]), busiest


def test_expert_load_is_a_share_and_a_bad_balance_is_refused():
    load = training.expert_load(torch.tensor([[0, 1], [1, 3]]), 4)
    assert load.tolist() == [0.25, 0.5, 0.0, 0.25]
    with pytest.raises(ValueError, match=r"^balance: expected one of"):
        training.train(training.TinyMoE(), training.make_task(), steps=1, balance="even")


def test_the_bias_chooses_experts_but_never_weighs_them():
    model = training.TinyMoE()
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model.bias[:] = torch.tensor([0.0, 10.0] + [0.0] * 6)
    weights, ids, probs = model.route(x)
    assert bool((ids == 1).any(dim=1).all())                       # expert 1 chosen by every token ...
    assert torch.allclose(weights, probs.gather(1, ids.long()) / probs.gather(1, ids.long()).sum(1, keepdim=True))


def test_the_figures_draw_and_name_a_bad_argument(histories):
    part8.plot_training({"none": histories["None"], "bias": histories["bias"]})
    part8.plot_saved_bytes(saved_bytes(4096, 8, 64, 32, 2, 16), "toy")
    fig = part8.plot_expert_grad_tiles([3, 0, 5], P=32, Q=16, block_p=16, block_q=16, block_m=4, group_m=2)
    labels = {t.get_text().split("\n")[0] for ax in fig.axes for t in ax.texts}
    assert {str(pid) for pid in range(3 * 2)} <= labels
    assert expert_tile(3, 32, 16, 16, 16, 2) == (1, 1, 0)
    with pytest.raises(ValueError, match=r"^block_p: expected block_p >= 1, got 0$"):
        part8.plot_expert_grad_tiles([1], P=8, Q=8, block_p=0, block_q=8, block_m=4)

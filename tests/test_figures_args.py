"""Parts 1 and 2's figure helpers, and the argument checks they share: a bad argument gets a message
that names it, says what was expected and what was given."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import pytest
import torch

from moe_tutorial.examples import worked_example
from moe_tutorial.figures import args, part1, part2


@pytest.fixture
def ex():
    return worked_example()


def test_check_int_messages():
    assert args.check_int("k", 3, 0, 4) == 3
    assert args.check_int("k", torch.tensor(2), 0, 4) == 2          # a 0-d tensor is an int too
    with pytest.raises(ValueError, match=r"^k: expected 0 <= k < 4 \(why\), got 4$"):
        args.check_int("k", 4, 0, 4, "why")
    with pytest.raises(ValueError, match=r"^k: expected k >= 1, got 0$"):
        args.check_int("k", 0, 1)
    with pytest.raises(TypeError, match=r"^k: expected an int, got bool True$"):
        args.check_int("k", True, 0)
    with pytest.raises(TypeError, match=r"^k: expected an int, got str '3'$"):
        args.check_int("k", "3", 0)


@pytest.mark.parametrize("value", [1, 2, 64, 1024])
def test_powers_of_two_pass(value):
    assert args.check_power_of_two("block", value) == value


@pytest.mark.parametrize("value", [3, 6, 48, 100])
def test_other_block_sizes_are_refused(value):
    with pytest.raises(ValueError, match=rf"^block: expected a power of two .*, got {value}$"):
        args.check_power_of_two("block", value)


def test_id_rows_accepts_tensors_and_lists_and_refuses_the_rest(ex):
    assert args.id_rows("topk_ids", ex.topk_ids) == [[0, 2], [2, 3]]
    assert args.id_rows("topk_ids", [[1], [0]]) == [[1], [0]]
    with pytest.raises(ValueError, match=r"^topk_ids: expected a 2-D \[M, topk\] table .*, got \(2,\)$"):
        args.id_rows("topk_ids", torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"^topk_ids: expected a 2-D \[M, topk\] table .*, got \(0, 2\)$"):
        args.id_rows("topk_ids", torch.zeros(0, 2, dtype=torch.int32))


def test_routing_figures_draw_the_worked_example(ex):
    probs = torch.softmax(torch.randn(2, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    figs = [part1.draw_routing(ex.topk_ids, ex.topk_weights, ex.E),
            part1.plot_router(probs, ex.topk_ids, ex.topk_weights),
            part1.plot_expert_view(ex.topk_ids, ex.E), part2.draw_gather(ex.topk_ids, ex.E)]
    assert all(f.axes for f in figs)


@pytest.mark.parametrize("draw", [
    lambda ex: part1.draw_routing(ex.topk_ids, ex.topk_weights, num_experts=3),
    lambda ex: part1.plot_expert_view(ex.topk_ids, num_experts=3),
    lambda ex: part2.draw_gather(ex.topk_ids, num_experts=3),
    lambda ex: part1.plot_router(torch.full((2, 3), 1 / 3), ex.topk_ids, ex.topk_weights),
])
def test_an_expert_id_past_E_is_named(ex, draw):
    """The worked example routes to expert 3: with only 3 experts drawn, that id is out of range."""
    with pytest.raises(ValueError, match=r"^topk_ids: expected expert ids in \[0, num_experts=3\), got an id of 3$"):
        draw(ex)


def test_router_weights_must_match_the_ids(ex):
    with pytest.raises(ValueError, match=r"^topk_weights: expected topk_ids's shape \(2, 2\), got shape \(2, 1\)$"):
        part1.draw_routing(ex.topk_ids, ex.topk_weights[:, :1], ex.E)
    with pytest.raises(ValueError, match=r"^topk_ids: expected one row per token of probs \(M = 3\), got 2 rows$"):
        part1.plot_router(torch.full((3, 4), 0.25), ex.topk_ids, ex.topk_weights)
    with pytest.raises(ValueError, match=r"^probs: expected a 2-D \[M, E\] tensor"):
        part1.plot_router(torch.full((4,), 0.25), ex.topk_ids, ex.topk_weights)


def test_launch_counts_need_one_per_E():
    part1.plot_launches([8, 64], {"loop": [86, 646]})
    with pytest.raises(ValueError, match=r"^launches\['loop'\]: expected one count per E \(2 of them\), got 1$"):
        part1.plot_launches([8, 64], {"loop": [86]})


def test_intermediate_sizes_checks_lengths_and_the_mark():
    tokens = [1, 2, 4]
    part2.plot_intermediate_sizes(tokens, {"a": [1e6, 2e6, 4e6]}, mark=("a", 2))
    with pytest.raises(ValueError, match=r"^sizes\['a'\]: expected one size per M of tokens \(3\), got 2$"):
        part2.plot_intermediate_sizes(tokens, {"a": [1e6, 2e6]})
    with pytest.raises(ValueError, match=r"^mark: expected \(model, M\) with a model of sizes \(a\), got 'b'$"):
        part2.plot_intermediate_sizes(tokens, {"a": [1e6, 2e6, 4e6]}, mark=("b", 2))
    with pytest.raises(ValueError, match=r"^mark: expected \(model, M\) with an M of tokens \(1 \.\.\. 4\), got 3$"):
        part2.plot_intermediate_sizes(tokens, {"a": [1e6, 2e6, 4e6]}, mark=("a", 3))


def test_round_trip_labels_must_name_arrows():
    part2.draw_round_trip({"gather": "1 GB"})
    with pytest.raises(ValueError, match=r"^labels: expected keys among gather, write, read_back, out, fused, got "
                                         r"readback$"):
        part2.draw_round_trip({"readback": "1 GB"})

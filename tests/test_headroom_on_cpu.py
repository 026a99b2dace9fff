"""shop_r1/headroom.py on hand-made answers: pass@1, sample exact and pass@k per target type, computed by hand, the
table and its "little to sharpen" note, the sample choice of `shop-r1 eval`, and a round trip through headroom.json.
No model, no Ray."""

import json

import pytest

from shop_r1.evaluate import headroom_indices
from shop_r1.headroom import Headroom, HeadroomRow, compute_headroom, format_headroom
from shop_r1.types import Action

CLICK = Action("click", name="product.tent_a")
QUERY = Action("type_and_submit", name="search_input", text="waterproof tent")
STOP = Action("terminate")


def _say(kind: str, **action: str) -> str:
    return json.dumps({"rationale": "I think so.", "action": {"type": kind, **action}})


RIGHT_CLICK = _say("click", name="product.tent_a")
WRONG_CLICK = _say("click", name="product.tent_b")
RIGHT_QUERY = _say("type_and_submit", name="search_input", text="waterproof tent")
NEAR_QUERY = _say("type_and_submit", name="search_input", text="waterproof tents")  # ROUGE-L high, not exact
STOP_SAID = _say("terminate")
BROKEN = '{"rationale": "I think'


def test_per_type_and_overall_by_hand():
    targets = [CLICK, CLICK, QUERY, STOP]
    greedy = [RIGHT_CLICK, WRONG_CLICK, NEAR_QUERY, STOP_SAID]
    samples = [[RIGHT_CLICK, WRONG_CLICK, BROKEN, RIGHT_CLICK],      # 2 of 4 exact
               [WRONG_CLICK, WRONG_CLICK, RIGHT_CLICK, STOP_SAID],   # 1 of 4: greedy wrong, a sample right
               [NEAR_QUERY, NEAR_QUERY, NEAR_QUERY, BROKEN],         # 0 of 4: near is not exact
               [STOP_SAID, STOP_SAID, STOP_SAID, STOP_SAID]]         # 4 of 4
    h = compute_headroom(greedy, samples, targets, temperature=0.6)
    assert h.k == 4 and h.temperature == 0.6
    assert h.per_type["click"] == HeadroomRow(n=2, pass_at_1=0.5, sample_exact=(0.5 + 0.25) / 2, pass_at_k=1.0)
    assert h.per_type["type_and_submit"] == HeadroomRow(n=1, pass_at_1=0.0, sample_exact=0.0, pass_at_k=0.0)
    assert h.per_type["terminate"] == HeadroomRow(n=1, pass_at_1=1.0, sample_exact=1.0, pass_at_k=1.0)
    assert h.overall == HeadroomRow(n=4, pass_at_1=0.5, sample_exact=(0.5 + 0.25 + 0 + 1) / 4, pass_at_k=0.75)
    assert h.overall.gap == pytest.approx(0.25)


def test_types_without_targets_are_left_out_and_the_dict_round_trips():
    h = compute_headroom([RIGHT_CLICK], [[WRONG_CLICK, RIGHT_CLICK]], [CLICK], temperature=1.0)
    assert set(h.per_type) == {"click"}
    assert Headroom.from_dict(json.loads(json.dumps(h.to_dict()))) == h


def test_unequal_sample_counts_and_lengths_are_refused():
    with pytest.raises(ValueError, match="same number k >= 1"):
        compute_headroom([RIGHT_CLICK, STOP_SAID], [[RIGHT_CLICK], [STOP_SAID, STOP_SAID]], [CLICK, STOP], 0.6)
    with pytest.raises(ValueError, match="same number k >= 1"):
        compute_headroom([RIGHT_CLICK], [[]], [CLICK], 0.6)
    with pytest.raises(ValueError, match="1 greedy answers, 2 sample lists"):
        compute_headroom([RIGHT_CLICK], [[RIGHT_CLICK], [RIGHT_CLICK]], [CLICK], 0.6)


def test_table_says_where_there_is_little_to_sharpen():
    sharp = compute_headroom([RIGHT_CLICK, WRONG_CLICK], [[RIGHT_CLICK] * 2, [WRONG_CLICK, RIGHT_CLICK]],
                             [CLICK, CLICK], 0.6)  # pass@1 50 %, pass@2 100 %
    flat = compute_headroom([RIGHT_CLICK, WRONG_CLICK], [[RIGHT_CLICK] * 2, [WRONG_CLICK] * 2],
                            [CLICK, CLICK], 0.6)  # pass@1 = pass@2 = 50 %
    text = format_headroom([("SFT", sharp), ("Shop-R1", flat)])
    lines = text.splitlines()
    assert "2 samples at temperature 0.6" in lines[0]
    sft = next(ln for ln in lines if ln.startswith("SFT "))
    assert sft.split()[1:6] == ["2", "50.0", "75.0", "100.0", "50/-/-"]
    assert lines[-1] == ("Shop-R1: pass@2 is within 5 points of pass@1 (50.0 vs 50.0 %): little for RL to "
                         "sharpen.")
    assert not any(ln.startswith("SFT: pass@") for ln in lines)
    assert format_headroom([]) == ""


def test_eval_samples_a_seeded_subset_in_file_order():
    assert headroom_indices(5, 8, seed=0) == [0, 1, 2, 3, 4]  # fewer examples than asked: all
    a = headroom_indices(100, 10, seed=3)
    assert a == headroom_indices(100, 10, seed=3) and a == sorted(a) and len(set(a)) == 10
    assert a != headroom_indices(100, 10, seed=4)

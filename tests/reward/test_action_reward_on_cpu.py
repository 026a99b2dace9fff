"""Every row of Table 1, the ROUGE-L threshold edge and the Table 4 ablation switches, by hand."""

import json

import pytest

from shop_r1.config import RewardConfig, SelfCertaintyConfig
from shop_r1.reward.action import exact_match
from shop_r1.reward.scorer import score_response
from shop_r1.types import Action


def respond(action: dict, rationale: str = "I think so.") -> str:
    return json.dumps({"rationale": rationale, "action": action})


CLICK = Action("click", name="a.b.c.d")
TAS = Action("type_and_submit", name="search_input", text="waterproof hiking backpack")
TERM = Action("terminate")


@pytest.mark.parametrize("action, target, expected", [
    # terminate: format 0.5 + type 0.3
    ({"type": "terminate"}, TERM, dict(format=0.5, action_type=0.3, attribute=0.0, value=0.0, total=0.8)),
    # wrong type: only the format reward
    ({"type": "terminate"}, CLICK, dict(format=0.5, action_type=0.0, attribute=0.0, value=0.0, total=0.5)),
    ({"type": "click", "name": "a.b.c.d"}, TAS, dict(action_type=0.0, attribute=0.0, value=0.0, total=0.5)),
    # click, exact name: 0.5 + 0.3 + 0.2 + 1000 * 1.0
    ({"type": "click", "name": "a.b.c.d"}, CLICK, dict(action_type=0.3, attribute=0.2, value=1000.0, total=1001.0)),
    # click, 3 of 4 tokens in order: P = R = 0.75 -> F = 0.75, exactly the threshold -> rewarded: 1000 * 0.75
    ({"type": "click", "name": "a.b.c.e"}, CLICK, dict(attribute=0.2, value=750.0, total=751.0)),
    # click, 2 of 4: F = 0.5 < 0.75 -> no value reward
    ({"type": "click", "name": "a.b.x.y"}, CLICK, dict(attribute=0.2, value=0.0, total=1.0)),
    # click with an empty (or blank) name: no attribute, no value
    ({"type": "click", "name": ""}, CLICK, dict(attribute=0.0, value=0.0, total=0.8)),
    ({"type": "click", "name": "   "}, CLICK, dict(attribute=0.0, value=0.0, total=0.8)),
    # click with no name key: still format-valid, earns type only
    ({"type": "click"}, CLICK, dict(format=0.5, attribute=0.0, value=0.0, total=0.8)),
    # type_and_submit, all right: 0.5 + 0.3 + (0.1 + 0.1) + (0.1 * 1 + 1000 * 1) = 1001.1
    ({"type": "type_and_submit", "name": "search_input", "text": "waterproof hiking backpack"}, TAS,
     dict(attribute=0.2, value=1000.1, total=1001.1)),
    # wrong input name (ROUGE 0), right text: 0.5 + 0.3 + 0.2 + 1000
    ({"type": "type_and_submit", "name": "other_box", "text": "Waterproof  hiking, backpack!"}, TAS,
     dict(attribute=0.2, value=1000.0, total=1001.0)),
    # right name, empty text: attribute 0.1, value 0.1 * 1.0
    ({"type": "type_and_submit", "name": "search_input", "text": ""}, TAS, dict(attribute=0.1, value=0.1, total=1.0)),
    # empty name, text 3 of 4 tokens vs 3-token target: P = 3/4, R = 1 -> F = 6/7 = 0.857 -> 1000 * 6/7
    ({"type": "type_and_submit", "name": "", "text": "waterproof hiking backpack cheap"}, TAS,
     dict(attribute=0.1, value=1000 * 6 / 7, total=0.9 + 1000 * 6 / 7)),
    # text with 1 of 3 tokens: F = 1/3 -> nothing; name right -> 0.1
    ({"type": "type_and_submit", "name": "search_input", "text": "backpack"}, TAS,
     dict(attribute=0.2, value=0.1, total=1.1)),
])
def test_table_1_rows(action, target, expected):
    r = score_response(respond(action), target, RewardConfig())
    assert r.format_valid
    for key, value in expected.items():
        assert getattr(r, key) == pytest.approx(value, abs=1e-9), key


def test_threshold_edge_survives_float_rounding():
    from shop_r1.reward.rouge import rouge_l

    # 3 predicted tokens, all in a 5-token target: P = 1, R = 0.6, F = 0.75 exactly, computed as 0.7499999999999999
    assert rouge_l("a b c", "a b c d e") < 0.75
    r = score_response(respond({"type": "click", "name": "a.b.c"}), Action("click", "a.b.c.d.e"), RewardConfig())
    assert r.value == pytest.approx(750.0)


def test_threshold_edge_is_inclusive_and_configurable():
    resp = respond({"type": "click", "name": "a.b.c.e"})  # ROUGE-L exactly 0.75 against a.b.c.d
    assert score_response(resp, CLICK, RewardConfig()).value == 750.0
    assert score_response(resp, CLICK, RewardConfig(rouge_threshold=0.76)).value == 0.0


def test_format_invalid_scores_zero_everywhere():
    r = score_response("I will click the first product.", CLICK, RewardConfig())
    assert (r.format, r.action_type, r.attribute, r.value, r.self_certainty, r.total) == (0, 0, 0, 0, 0, 0)
    assert not r.format_valid


def test_ablation_format_reward_off():
    r = score_response(respond({"type": "click", "name": "a.b.c.d"}), CLICK, RewardConfig(format_reward=False))
    assert (r.format, r.total) == (0.0, 1000.5)  # valid responses still earn the rest: 0.3 + 0.2 + 1000


def test_ablation_reward_scale_off_sets_dars_to_one():
    cfg = RewardConfig(reward_scale=False)
    assert score_response(respond({"type": "click", "name": "a.b.c.d"}), CLICK, cfg).total == pytest.approx(2.0)
    # type_and_submit: 0.5 + 0.3 + 0.2 + 0.1 * 1 + 1 * 1 = 2.1
    tas = respond({"type": "type_and_submit", "name": "search_input", "text": "waterproof hiking backpack"})
    assert score_response(tas, TAS, cfg).total == pytest.approx(2.1)


def test_dars_factor_is_the_multiplier():
    r = score_response(respond({"type": "click", "name": "a.b.c.e"}), CLICK, RewardConfig(dars_factor=10.0))
    assert r.value == pytest.approx(7.5)  # 10 * 0.75


def test_terminate_value_pays_a_correct_terminate_in_dars_units():
    cfg = RewardConfig(terminate_value=0.5)  # 0.5 * DARS 1000 = 500
    right = score_response(respond({"type": "terminate"}), TERM, cfg)
    assert (right.format, right.action_type, right.attribute, right.value, right.total) == (0.5, 0.3, 0.0, 500.0, 500.8)
    assert score_response(respond({"type": "terminate"}), CLICK, cfg).total == 0.5  # wrong type: format only
    # A correct exact click (0.5 + 0.3 + 0.2 + 1000) is unchanged; with terminate_value = 1 both earn the same value.
    click = score_response(respond({"type": "click", "name": "a.b.c.d"}), CLICK, RewardConfig(terminate_value=1.0))
    term = score_response(respond({"type": "terminate"}), TERM, RewardConfig(terminate_value=1.0))
    assert click.value == term.value == 1000.0
    # Without DARS (reward_scale off) the unit is 1.
    assert score_response(respond({"type": "terminate"}), TERM,
                          RewardConfig(terminate_value=0.5, reward_scale=False)).value == 0.5
    # The binary ablation ignores it: an exact terminate earns what an exact click earns.
    assert score_response(respond({"type": "terminate"}), TERM,
                          RewardConfig(terminate_value=1.0, action_reward="binary")).total == 1.5


def test_type_value_pays_the_right_type_in_dars_units():
    cfg = RewardConfig(type_value=0.2)  # 0.2 * DARS 1000 = 200 for a right click or query type, whatever the name
    wrong_name = score_response(respond({"type": "click", "name": "x.y"}), CLICK, cfg)
    assert (wrong_name.action_type, wrong_name.attribute, wrong_name.value) == (0.3, 0.2, 200.0)
    assert wrong_name.total == 201.0
    exact = score_response(respond({"type": "click", "name": "a.b.c.d"}), CLICK, cfg)
    assert exact.value == 1200.0  # 1000 * ROUGE 1.0 + 200
    # A query: 0.1 * ROUGE(name) 1.0 + 1000 * ROUGE(text) (2 of 3 tokens: P = 1, R = 2/3, F = 0.8) + 200
    near = score_response(respond({"type": "type_and_submit", "name": "search_input", "text": "hiking backpack"}),
                          TAS, cfg)
    assert near.value == pytest.approx(1000.1)
    far = score_response(respond({"type": "type_and_submit", "name": "search_input", "text": "tent"}), TAS, cfg)
    assert far.value == pytest.approx(200.1)  # F = 0 < 0.75: only the name's 0.1 and the type's 200
    # A wrong type earns nothing of it; a terminate is paid by terminate_value only.
    assert score_response(respond({"type": "type_and_submit", "name": "search_input", "text": "a"}), CLICK,
                          cfg).total == 0.5
    assert score_response(respond({"type": "terminate"}), TERM, cfg).value == 0.0
    assert score_response(respond({"type": "click", "name": "x.y"}), CLICK,
                          RewardConfig(type_value=0.2, reward_scale=False)).value == pytest.approx(0.2)
    assert score_response(respond({"type": "click", "name": "x.y"}), CLICK,
                          RewardConfig(type_value=1.0, action_reward="binary")).total == 0.5


def test_ablation_binary_action_reward():
    cfg = RewardConfig(action_reward="binary")
    exact = score_response(respond({"type": "click", "name": " a.b.c.d "}), CLICK, cfg)
    assert (exact.format, exact.action_type, exact.attribute, exact.value, exact.total) == (0.5, 1.0, 0, 0, 1.5)
    near = score_response(respond({"type": "click", "name": "a.b.c.e"}), CLICK, cfg)
    assert near.total == 0.5  # partial credit is gone: only the format reward
    assert score_response(respond({"type": "terminate"}), TERM, cfg).total == 1.5


def test_ablation_rationale_reward_off_keeps_reporting_s_but_drops_it_from_total():
    from shop_r1.types import TokenLogprobs

    resp = respond({"type": "terminate"}, rationale="ok")
    start = resp.index('"ok"') + 1
    lp = TokenLogprobs(token_offsets=(0, start, start + 2), topk_logprobs=((-0.1,), (0.0,), (-0.1,)), vocab_size=8)
    # The rationale token has p = 1 over V = 8: KL(p||U) = 1 * log 1 + log 8 = 2.0794
    on = score_response(resp, TERM, RewardConfig(self_certainty=SelfCertaintyConfig(source="topk_logprobs")), lp)
    off = score_response(resp, TERM, RewardConfig(rationale_reward=False,
                                                  self_certainty=SelfCertaintyConfig(source="topk_logprobs")), lp)
    assert on.self_certainty == pytest.approx(2.0794415, abs=1e-6) == off.self_certainty
    assert on.total == pytest.approx(0.8 + 0.005 * 2.0794415)
    assert off.total == pytest.approx(0.8)


@pytest.mark.parametrize("pred, target, expected", [
    (Action("terminate"), TERM, True),
    (Action("click", "a.b"), Action("click", " a.b "), True),
    (Action("click", "a.b"), Action("click", "a.c"), False),
    (Action("type_and_submit", "q", "Red  Shoes "), Action("type_and_submit", "q", "red shoes"), True),
    (Action("type_and_submit", "q", "red shoe"), Action("type_and_submit", "q", "red shoes"), False),
    (Action("type_and_submit", "q2", "red shoes"), Action("type_and_submit", "q", "red shoes"), False),
    (Action("terminate"), Action("click", "a"), False),
    (None, TERM, False),
])
def test_exact_match_rule(pred, target, expected):
    assert exact_match(pred, target) is expected

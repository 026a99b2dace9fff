"""reward.click_guard: a click's ROUGE value only for the page's best match of the target's element, by hand."""

import json

import pytest

from shop_r1.config import RewardConfig
from shop_r1.reward.click_guard import click_value_allowed, element_names, page_element_names
from shop_r1.reward.io import score_jsonl
from shop_r1.reward.scorer import score_response
from shop_r1.reward.worker import RewardWorker
from shop_r1.types import Action, Message, ScoreRequest

TARGET = Action("click", name="view.product.blue_hiking_backpack_40l")
SIBLING = "view.product.blue_hiking_backpack_30l"  # 5 of the target's 6 tokens: ROUGE-L 5/6 = 0.833 >= 0.75
ABSENT = "view.product.blue_hiking_backpack_50l"   # the same ROUGE-L, but on no page
PAGE = ("nav.home", "search_box", TARGET.name, SIBLING, "add_to_cart")
GUARD = RewardConfig(click_guard=True)


def click(name: str) -> str:
    return json.dumps({"rationale": "I want that one.", "action": {"type": "click", "name": name}})


def test_off_by_default_and_table_1_pays_near_misses():
    assert RewardConfig().click_guard is False
    for name in (SIBLING, ABSENT):
        r = score_response(click(name), TARGET, RewardConfig(), page_names=PAGE)
        assert r.value == pytest.approx(1000 * 5 / 6)  # DARS * ROUGE-L 0.833, page or not


def test_target_clicked_keeps_its_value():
    # 0.5 + 0.3 + 0.2 + 1000 * 1.0
    r = score_response(click(TARGET.name), TARGET, GUARD, page_names=PAGE)
    assert (r.action_type, r.attribute, r.value, r.total) == (0.3, 0.2, 1000.0, 1001.0)


def test_name_on_no_page_earns_no_value():
    # ROUGE-L 0.833 would pay 833.3; the name is not on the page -> value 0; format, type, attribute stay: 1.0
    r = score_response(click(ABSENT), TARGET, GUARD, page_names=PAGE)
    assert (r.format, r.action_type, r.attribute, r.value) == (0.5, 0.3, 0.2, 0.0)
    assert r.total == pytest.approx(1.0)


def test_another_element_matching_better_earns_no_value():
    # SIBLING is on the page and matches itself at 1.0, better than the target's 0.833 -> value 0
    r = score_response(click(SIBLING), TARGET, GUARD, page_names=PAGE)
    assert (r.action_type, r.attribute, r.value) == (0.3, 0.2, 0.0)


def test_a_tie_with_the_target_keeps_the_value():
    # "nav_home" and "nav.home" are both on the page with the same ROUGE tokens (nav, home): the target matches the
    # prediction at 1.0, as well as any other element -> value kept (1000 * 1.0)
    target = Action("click", name="nav.home")
    r = score_response(click("nav_home"), target, GUARD, page_names=("nav.home", "nav_home", "search_box"))
    assert r.value == 1000.0


def test_the_targets_own_name_counts_as_on_the_page():
    # An exact answer is never punished for an element the HTML extraction missed.
    r = score_response(click(TARGET.name), TARGET, GUARD, page_names=("nav.home",))
    assert r.value == 1000.0


def test_names_are_compared_stripped():
    assert click_value_allowed(f"  {TARGET.name} ", TARGET.name, [f"{TARGET.name}\n", SIBLING])
    assert not click_value_allowed(ABSENT, TARGET.name, PAGE)
    assert not click_value_allowed(SIBLING, TARGET.name, PAGE)


def test_type_and_submit_and_terminate_are_unchanged():
    tas = Action("type_and_submit", name="search_box", text="hiking backpack")
    answer = json.dumps({"rationale": "r", "action": {"type": "type_and_submit", "name": "search_bx",
                                                      "text": "hiking backpack"}})
    assert score_response(answer, tas, GUARD, page_names=PAGE) == score_response(answer, tas, RewardConfig())
    term = json.dumps({"rationale": "r", "action": {"type": "terminate"}})
    assert score_response(term, Action("terminate"), GUARD, page_names=()).total == pytest.approx(0.8)


def test_guard_without_page_names_is_loud():
    with pytest.raises(ValueError, match="click_guard needs the page's element names"):
        score_response(click(TARGET.name), TARGET, GUARD)
    # In the reward worker it is the flagged fallback (counted in reward/num_failed), not a silent pass or fail.
    [r] = RewardWorker(GUARD).score([ScoreRequest(click(TARGET.name), TARGET)])
    assert r.total == 0.0 and "click_guard" in r.error


def test_worker_passes_the_requests_page_names():
    rewards = RewardWorker(GUARD).score([ScoreRequest(click(SIBLING), TARGET, None, PAGE),
                                         ScoreRequest(click(TARGET.name), TARGET, None, PAGE)])
    assert [r.value for r in rewards] == [0.0, 1000.0]


def test_score_jsonl_reads_page_names(tmp_path):
    lines = [{"response": click(SIBLING), "target": TARGET.to_dict(), "page_names": list(PAGE)}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    score_jsonl(tmp_path / "in.jsonl", tmp_path / "out.jsonl", GUARD)
    assert json.loads((tmp_path / "out.jsonl").read_text())["reward"]["value"] == 0.0
    (tmp_path / "in.jsonl").write_text(json.dumps({"response": click(SIBLING), "target": TARGET.to_dict()}) + "\n")
    with pytest.raises(ValueError, match=r"in\.jsonl:1: page_names"):
        score_jsonl(tmp_path / "in.jsonl", tmp_path / "out.jsonl", GUARD)


# ------------------------------------------------------------------------------------- element names from the HTML


def test_element_names_reads_name_attributes_in_page_order():
    html = ('<a name="nav.home">Home</a><input type="text" name=\'search_box\'/>'
            '<div data-name="not.an.element" class="x"><a name="view.product.salt &amp; pepper">S&amp;P</a></div>'
            '<button name="nav.home">again</button><a name="">empty</a><span username="u">x</span>')
    assert element_names(html) == ("nav.home", "search_box", "view.product.salt & pepper")


def test_page_element_names_reads_the_last_user_turn():
    messages = (Message("system", 'You see pages. <a name="system.example">'),
                Message("user", 'Page 1 (simplified HTML):\n<a name="old.page.link">x</a>'),
                Message("assistant", '{"action": {"type": "click", "name": "old.page.link"}}'),
                Message("user", 'Page 2 (simplified HTML):\n<button name="add_to_cart">Add</button>'))
    assert page_element_names(messages) == ("add_to_cart",)
    assert page_element_names((Message("system", "s"),)) == ()

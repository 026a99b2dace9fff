"""SFT conversations and RL examples: structure, truncation (oldest page first), latest-step, balancing, IO."""

import json
from collections import Counter

import pytest

from shop_r1.data.examples import (
    balance_rl_examples,
    build_rl_examples,
    build_sft_examples,
    chat_token_counter,
    load_rl_examples,
    load_sft_examples,
    type_counts,
    write_examples_jsonl,
)
from shop_r1.data.prompts import SYSTEM_PROMPT, apply_chat_template
from shop_r1.types import Action, Message, RLExample, Session, Step

PAGE = "<html>" + "x" * 400 + "</html>"


def _session(sid="s", n=4, rationale=True) -> Session:
    actions = [Action("type_and_submit", "search_input", "red shoes"), Action("click", "refinements.brand.acme"),
               Action("click", "search_results.Acme Shoe.view_product"), Action("terminate")]
    return Session(sid, tuple(Step(f"<html>page {i} {PAGE}</html>", actions[i % 4],
                                   f"I act {i}." if rationale else None) for i in range(n)))


def chars(messages):  # a token counter with round numbers: 1 token per 10 characters
    return sum(len(m.content) for m in messages) // 10


def test_sft_keeps_the_whole_session():
    build = build_sft_examples([_session("a"), _session("b", rationale=False)])
    assert build.skipped_session_ids == ("b",)
    (ex,) = build.examples
    roles = [m.role for m in ex.messages]
    assert roles == ["system"] + ["user", "assistant"] * 4
    assert ex.messages[0].content == SYSTEM_PROMPT
    first = json.loads(ex.messages[2].content)
    assert first == {"rationale": "I act 0.", "action": {"type": "type_and_submit", "name": "search_input",
                                                         "text": "red shoes"}}


def test_rl_examples_one_per_step_after_the_first():
    build = build_rl_examples([_session(n=4)], "whole_session", 10**6, chars)
    assert [e.step_index for e in build.examples] == [1, 2, 3]
    ex = build.examples[2]
    assert ex.example_id == "s:3" and ex.target == Action("terminate") and ex.num_dropped_pages == 0
    assert [m.role for m in ex.prompt] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert "page 3" in ex.prompt[-1].content  # ends with the current page
    history = [json.loads(m.content) for m in ex.prompt if m.role == "assistant"]
    # by default history turns have the output format: the recorded rationale and the action
    assert history[1] == {"rationale": "I act 1.", "action": {"type": "click", "name": "refinements.brand.acme"}}
    bare = build_rl_examples([_session(n=4)], "whole_session", 10**6, chars, history_rationales=False).examples[2]
    assert all("rationale" not in json.loads(m.content) for m in bare.prompt if m.role == "assistant")


def test_truncation_drops_the_oldest_pages_first_and_keeps_actions_and_current_page():
    session = _session(n=4)
    full = chars(build_rl_examples([session], "whole_session", 10**6, chars).examples[2].prompt)
    # Each page is ~43 "tokens"; allow room for about one earlier page less.
    budget = full - 30
    ex = build_rl_examples([session], "whole_session", budget, chars).examples[2]
    assert ex.num_dropped_pages == 1
    users = [m.content for m in ex.prompt if m.role == "user"]
    assert "HTML omitted" in users[0] and "page 1" in users[1] and "page 2" in users[2] and "page 3" in users[3]
    assert chars(ex.prompt) <= budget
    assert sum(m.role == "assistant" for m in ex.prompt) == 3  # the action history is intact
    tight = build_rl_examples([session], "whole_session", budget - 90, chars).examples[2]
    assert tight.num_dropped_pages == 3 and "page 3" in tight.prompt[-1].content


def test_example_whose_current_page_alone_is_too_long_is_counted_not_lost_silently():
    build = build_rl_examples([_session(n=3)], "whole_session", 20, chars)
    assert build.examples == () and build.over_budget_ids == ("s:1", "s:2")


def test_latest_step_context_omits_every_earlier_page():
    ex = build_rl_examples([_session(n=4)], "latest_step", 10**6, chars).examples[2]
    users = [m.content for m in ex.prompt if m.role == "user"]
    assert ex.num_dropped_pages == 3
    assert all("HTML omitted" in u for u in users[:-1]) and PAGE in users[-1]
    with pytest.raises(ValueError, match="context"):
        build_rl_examples([_session()], "everything", 100, chars)


def test_real_chat_template_counter(tiny_tokenizer):
    count = chat_token_counter(tiny_tokenizer)
    prompt = (Message("system", "S"), Message("user", "hello shop"))
    text = apply_chat_template(tiny_tokenizer, prompt, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert count(prompt) == len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
    session = _session(n=4)
    full = build_rl_examples([session], "whole_session", 10**6, count).examples[2]
    cut = build_rl_examples([session], "whole_session", count(full.prompt) - 1, count).examples[2]
    assert cut.num_dropped_pages >= 1 and count(cut.prompt) <= count(full.prompt) - 1


def _ex(i: int, kind: str) -> RLExample:
    action = {"click": Action("click", "a"), "type_and_submit": Action("type_and_submit", "q", "t"),
              "terminate": Action("terminate")}[kind]
    return RLExample(f"e{i}", "s", 1, (Message("user", "p"),), action)


def test_balancing_gives_ten_percent_more_of_each_complex_type():
    examples = [_ex(i, "click") for i in range(50)] + [_ex(100 + i, "type_and_submit") for i in range(15)] + \
        [_ex(200 + i, "terminate") for i in range(20)]
    out = balance_rl_examples(examples, ratio=1.1, seed=0)
    # 20 terminate -> 22 click (subsampled) and 22 type_and_submit (15 kept + 7 resampled)
    assert type_counts(out) == {"click": 22, "type_and_submit": 22, "terminate": 20}
    assert len({e.example_id for e in out if e.target.type == "click"}) == 22  # no duplicates when subsampling
    assert {e.example_id for e in out if e.target.type == "type_and_submit"} == {f"e{100 + i}" for i in range(15)}
    assert out == balance_rl_examples(examples, ratio=1.1, seed=0)
    assert out != balance_rl_examples(examples, ratio=1.1, seed=1)
    no_term = [_ex(i, "click") for i in range(3)]
    assert balance_rl_examples(no_term) == no_term


def test_write_and_load_round_trip_and_bad_lines(tmp_path):
    rl = list(build_rl_examples([_session()], "whole_session", 10**6, chars).examples)
    sft = list(build_sft_examples([_session()]).examples)
    write_examples_jsonl(rl, tmp_path / "rl.jsonl")
    write_examples_jsonl(sft, tmp_path / "sft.jsonl")
    assert load_rl_examples(tmp_path / "rl.jsonl") == rl
    assert load_sft_examples(tmp_path / "sft.jsonl") == sft
    lines = (tmp_path / "rl.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["target"] = {"type": "click"}
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: target\.name"):
        load_rl_examples(tmp_path / "bad.jsonl")


def test_type_counts_include_zeros():
    assert type_counts([_ex(0, "click")]) == {"click": 1, "type_and_submit": 0, "terminate": 0}
    assert Counter(type_counts([]).values()) == Counter({0: 3})

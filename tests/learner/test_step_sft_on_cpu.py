"""Step-format SFT (data.sft_format=step): one conversation per prediction step, built exactly like the RL prompt,
with the loss on its answer only; and the held-out prompt budget that keeps long pages in the test set."""

import json

from shop_r1.config import DataConfig
from shop_r1.data.build import build_datasets
from shop_r1.data.examples import (
    build_rl_examples,
    build_step_sft_examples,
    chat_token_counter,
    load_sft_examples,
    write_examples_jsonl,
)
from shop_r1.data.prompts import render_action
from shop_r1.data.sessions import write_sessions
from shop_r1.data.synth import synthesize_sessions
from shop_r1.learner.sft_data import tokenize_sft_example
from shop_r1.types import Action, Session, Step


def _session() -> Session:
    acts = [Action("type_and_submit", "search_input", "red shoes"), Action("click", "buy_now"), Action("terminate")]
    return Session("s", tuple(Step(f"<html>page {i}</html>", acts[i], f"Reason {i}.") for i in range(3)))


def test_step_examples_are_the_rl_prompts_plus_the_answer_with_loss_on_it_only(tiny_tokenizer, tmp_path):
    rl = build_rl_examples([_session()], "latest_step", 10_000, chat_token_counter(tiny_tokenizer)).examples
    sft = build_step_sft_examples(rl).examples
    assert [e.session_id for e in sft] == ["s:1", "s:2"] and all(e.train_last_turn_only for e in sft)
    assert sft[1].messages[:-1] == rl[1].prompt  # the very prompt RL and evaluation see
    assert sft[1].messages[-1].content == render_action(Action("terminate"), "Reason 2.")
    seq = tokenize_sft_example(sft[1], tiny_tokenizer, 10_000)
    masked = tiny_tokenizer.decode([t for t, m in zip(seq.input_ids, seq.loss_mask) if m])
    # Only the last answer is a target; the history's answers (Reason 0., Reason 1.) are context.
    assert masked == sft[1].messages[-1].content + "<|im_end|>"
    assert "Reason 0." in tiny_tokenizer.decode(seq.input_ids)
    write_examples_jsonl(sft, tmp_path / "sft.jsonl")
    assert load_sft_examples(tmp_path / "sft.jsonl") == list(sft)  # the flag survives the round trip
    assert json.loads((tmp_path / "sft.jsonl").read_text().splitlines()[0])["train_last_turn_only"] is True


def test_held_out_budget_keeps_long_pages_in_the_test_set(tiny_model_dir, tmp_path):
    sessions = synthesize_sessions(12, seed=4)
    write_sessions(sessions, tmp_path / "s.jsonl")
    tight = DataConfig(context="latest_step", max_prompt_tokens=1300, test_fraction=0.5, sft_format="step")
    built = build_datasets(tmp_path / "s.jsonl", tmp_path / "a", tiny_model_dir, tight)
    assert built.num_rl_test_over_budget > 0 and "held-out set is filtered by page length" in built.render()
    roomy = DataConfig(context="latest_step", max_prompt_tokens=1300, test_max_prompt_tokens=8000,
                       test_fraction=0.5, sft_format="step")
    kept = build_datasets(tmp_path / "s.jsonl", tmp_path / "b", tiny_model_dir, roomy)
    assert kept.num_rl_test_over_budget == 0
    assert kept.rl_test.num_examples == built.rl_test.num_examples + built.num_rl_test_over_budget
    assert kept.num_rl_over_budget == built.num_rl_over_budget > 0  # training still keeps its budget
    # One SFT conversation per (unbalanced) training RL example.
    assert kept.num_sft_train == sum(kept.rl_train_before_balance.values()) > 0

"""data.rationale_fraction and data.sft_missing_rationale (issue 47's scarce-rationales regime): which training
sessions keep their rationales, what SFT and RL are built from, and that validation and test keep theirs."""

import json

from shop_r1.config.data import DataConfig
from shop_r1.data.build import build_datasets
from shop_r1.data.examples import build_step_sft_examples, drop_rationales
from shop_r1.data.sessions import write_sessions
from shop_r1.data.synth import synthesize_sessions
from shop_r1.types import Action, RLExample, Session, Step


def _session(i: int, n: int = 3) -> Session:
    return Session(f"s{i}", tuple(Step(f"<html>{i}.{t}</html>", Action("terminate"), f"why {i}.{t}") for t in range(n)))


def test_drop_rationales_keeps_a_seeded_share_by_session_in_order():
    sessions = [_session(i) for i in range(10)]
    out = drop_rationales(sessions, 0.3, seed=5)
    assert [s.session_id for s in out] == [s.session_id for s in sessions]
    kept = [s for s in out if s.steps[0].rationale is not None]
    assert len(kept) == 3
    # a session keeps all its rationales or none; everything else is unchanged
    assert all(all(st.rationale is not None for st in s.steps) == (s in kept) for s in out)
    assert all(st.rationale is None for s in out if s not in kept for st in s.steps)
    assert [st.observation for s in out for st in s.steps] == [st.observation for s in sessions for st in s.steps]
    assert out == drop_rationales(sessions, 0.3, seed=5)            # seeded
    assert drop_rationales(sessions, 1.0, seed=5) == tuple(sessions)
    assert all(st.rationale is None for s in drop_rationales(sessions, 0.0, seed=5) for st in s.steps)


def test_step_sft_skips_or_trains_the_action_alone():
    prompt = ()
    examples = [RLExample("a", "s", 0, prompt, Action("terminate"), "why"),
                RLExample("b", "s", 1, prompt, Action("terminate"))]
    skipped = build_step_sft_examples(examples)
    assert [e.session_id for e in skipped.examples] == ["a"] and skipped.skipped_session_ids == ("b",)
    both = build_step_sft_examples(examples, "action_only")
    assert [e.session_id for e in both.examples] == ["a", "b"] and not both.skipped_session_ids
    assert json.loads(both.examples[1].messages[-1].content) == {"action": {"type": "terminate"}}
    assert json.loads(both.examples[0].messages[-1].content)["rationale"] == "why"


def _build(tmp_path, tiny_model_dir, **data):
    path = tmp_path / "sessions.jsonl"
    write_sessions(synthesize_sessions(40, seed=3, version=4), path)
    cfg = DataConfig(sessions_path=str(path), sft_format="step", context="latest_step", val_fraction=0.2,
                     max_prompt_tokens=100_000, **data)
    built = build_datasets(path, tmp_path / "out", tiny_model_dir, cfg, seed=1)
    read = {k: [json.loads(x) for x in (tmp_path / "out" / f"{k}.jsonl").read_text().splitlines()]
            for k in ("sft_train", "rl_train", "rl_test", "rl_val")}
    return built, read


def test_scarce_rationales_shrink_sft_only(tmp_path, tiny_model_dir):
    full, full_read = _build(tmp_path / "full", tiny_model_dir)
    scarce, scarce_read = _build(tmp_path / "scarce", tiny_model_dir, rationale_fraction=0.25)
    actions, _ = _build(tmp_path / "actions", tiny_model_dir, rationale_fraction=0.25,
                        sft_missing_rationale="action_only")
    # RL trains on every session's action: the same targets; held-out sets keep their rationales and are unchanged
    assert [e["target"] for e in scarce_read["rl_train"]] == [e["target"] for e in full_read["rl_train"]]
    assert scarce_read["rl_test"] == full_read["rl_test"] and scarce_read["rl_val"] == full_read["rl_val"]
    assert 0.1 < scarce.train_sessions.rationale_coverage < 0.45 and full.train_sessions.rationale_coverage == 1.0
    # SFT keeps the steps of the annotated sessions (about a quarter), or every step with the action alone
    assert 0.1 * full.num_sft_train < scarce.num_sft_train < 0.45 * full.num_sft_train
    assert scarce.num_sft_skipped == full.num_sft_train - scarce.num_sft_train
    assert actions.num_sft_train == full.num_sft_train and actions.num_sft_skipped == 0
    assert "without a rationale left out: data.sft_missing_rationale=skip" in scarce.render()
    none, _ = _build(tmp_path / "none", tiny_model_dir, rationale_fraction=0.0)
    assert none.num_sft_train == 0 and "WARNING: 0 SFT conversations" in none.render()

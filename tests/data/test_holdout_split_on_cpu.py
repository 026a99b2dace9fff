"""data.holdout (issue 47's held-out shoppers or products): the persona fields, the split worked out by hand, its
errors, the config's parse, and a build whose validation and test sets are kinds no training example has."""

import json

import pytest

from shop_r1.config import ConfigError, load_config
from shop_r1.config.data import DataConfig, parse_holdout
from shop_r1.data.build import build_datasets
from shop_r1.data.sessions import holdout_split, persona_fields, write_sessions
from shop_r1.data.synth import synthesize_sessions
from shop_r1.errors import DataError
from shop_r1.types import Action, Session, Step


def _session(i: int, noun: str | None) -> Session:
    persona = None if noun is None else f"Looking for: {noun}\nBudget: under $50"
    return Session(f"s{i}", (Step("<html></html>", Action("terminate"), "why"),), persona=persona)


def test_persona_fields_and_the_split_by_hand():
    assert persona_fields(_session(0, "tent")) == {"Looking for": "tent", "Budget": "under $50"}
    assert persona_fields(_session(0, None)) == {}
    nouns = ["tent", "blender", "tent", "sandals", "tent", "blender", None, "tent", "sandals", "tent"]
    sessions = [_session(i, n) for i, n in enumerate(nouns)]
    split = holdout_split(sessions, "Looking for", ["tent", "sandals"], val_fraction=0.1, test_fraction=0.3, seed=4)
    held = {s.session_id for s in split.val + split.test}
    assert held == {"s0", "s2", "s3", "s4", "s7", "s8", "s9"}  # every tent and sandals session, nothing else
    assert [s.session_id for s in split.train] == ["s1", "s5", "s6"]  # in order, persona-less ones train
    assert len(split.val) == 2 and len(split.test) == 5  # 7 x 0.1 / (0.1 + 0.3) = 1.75 -> 2
    assert not {s.session_id for s in split.val} & {s.session_id for s in split.test}
    assert holdout_split(sessions, "Looking for", ["tent", "sandals"], 0.1, 0.3, seed=4) == split  # seeded
    no_val = holdout_split(sessions, "Looking for", ["tent"], 0.0, 0.3, seed=4)
    assert not no_val.val and len(no_val.test) == 5


def test_holdout_errors_name_the_key_and_the_values_there_are():
    sessions = [_session(0, "tent"), _session(1, "blender")]
    with pytest.raises(DataError, match=r"data.holdout: no session has Looking for: kettle \(the values of 'Looking "
                                        r"for': blender, tent\)"):
        holdout_split(sessions, "Looking for", ["tent", "kettle"], 0.1, 0.1, seed=0)
    with pytest.raises(DataError, match="nothing is left to train on"):
        holdout_split(sessions, "Looking for", ["tent", "blender"], 0.1, 0.1, seed=0)
    with pytest.raises(DataError, match="no session's persona has this field"):
        holdout_split(sessions, "Brand", ["x"], 0.1, 0.1, seed=0)


def test_parse_holdout_and_the_config_rule():
    assert parse_holdout("") == ("", ())
    assert parse_holdout(" Looking for = tent | coffee maker ") == ("Looking for", ("tent", "coffee maker"))
    for bad in ("tent", "=tent", "Looking for=", "Looking for=tent||blender", "Looking for=tent|tent"):
        with pytest.raises(ConfigError, match="data.holdout"):
            parse_holdout(bad)
    with pytest.raises(ConfigError, match=r"data.holdout='Looking for': format: FIELD=VALUE"):
        load_config(None, ["data.holdout=Looking for"])


def test_a_holdout_build_never_trains_on_the_held_out_kinds(tmp_path, tiny_model_dir):
    path = tmp_path / "sessions.jsonl"
    sessions = synthesize_sessions(60, seed=3, version=4)
    write_sessions(sessions, path)
    nouns = sorted({persona_fields(s)["Looking for"] for s in sessions})
    held = nouns[:3]
    cfg = DataConfig(sessions_path=str(path), sft_format="step", context="latest_step", val_fraction=0.1,
                     test_fraction=0.1, max_prompt_tokens=100_000, holdout=f"Looking for={'|'.join(held)}")
    built = build_datasets(path, tmp_path / "out", tiny_model_dir, cfg, seed=1)
    read = {k: [json.loads(x) for x in (tmp_path / "out" / f"{k}.jsonl").read_text().splitlines()]
            for k in ("sft_train", "rl_train", "rl_test", "rl_val")}
    by_id = {s.session_id: persona_fields(s)["Looking for"] for s in sessions}
    for e in read["sft_train"]:  # step SFT conversations are named by their RL example (SESSION:STEP)
        e["session_id"] = e["session_id"].rsplit(":", 1)[0]
    for name in ("sft_train", "rl_train"):
        assert read[name] and not {by_id[e["session_id"]] for e in read[name]} & set(held), name
    for name in ("rl_test", "rl_val"):
        assert read[name] and {by_id[e["session_id"]] for e in read[name]} <= set(held), name
    num_held = sum(1 for n in by_id.values() if n in held)
    assert built.test_sessions.num_sessions + built.num_val_sessions == num_held
    assert built.num_val_sessions == round(num_held / 2)
    assert f"out of distribution (data.holdout=Looking for={'|'.join(held)})" in built.render()

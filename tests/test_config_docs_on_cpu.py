"""The config package: one module per section under ~300 lines, every key documented beside its field (what
`shop-r1 config show --doc` prints), and `validate`, which runs every rule of a stage before any actor starts."""

from pathlib import Path

import pytest

import shop_r1.config as config_module
from shop_r1.config import Config, ConfigError, config_to_dict, load_config, validate
from shop_r1.config.docs import key_docs, render_docs
from shop_r1.run_config import flatten
from shop_r1.types import Action, Prompt

PACKAGE = Path(config_module.__file__).parent


def test_no_module_of_the_package_is_over_300_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    assert not {name: n for name, n in sizes.items() if n > 300}


def test_every_key_has_its_doc_type_and_default():
    docs = key_docs()
    assert [d.key for d in docs] == list(flatten(config_to_dict(Config())))
    assert not [d.key for d in docs if not d.doc]  # a docstring beside every field
    by_key = {d.key: d for d in docs}
    assert (by_key["rl.lr"].type, by_key["rl.lr"].default, by_key["rl.lr"].range) == ("float", "1e-07", "> 0")
    assert by_key["rl.lr"].doc == "Learning rate (constant after rl.warmup_steps)."
    assert by_key["rollout.group_size"].range == ">= 2" and by_key["seed"].range == ""  # seeds: any int
    assert by_key["data.context"].type == "one of whole_session, latest_step"
    assert by_key["data.synthetic"].default == "false" and by_key["run_dir"].default == '"runs/default"'
    assert by_key["reward.self_certainty.source"].section == "reward" and by_key["seed"].section == ""


def test_render_docs_of_a_key_a_section_and_an_unknown_key():
    assert render_docs("rl.lr") == \
        "rl.lr: float = 1e-07  (range > 0)\n    Learning rate (constant after rl.warmup_steps)."
    section = render_docs("reward.self_certainty")
    assert [line.split(":")[0] for line in section.splitlines() if not line.startswith(" ")] == [
        "reward.self_certainty.source", "reward.self_certainty.direction", "reward.self_certainty.normalize_by_vocab"]
    with pytest.raises(ConfigError, match=r"^rl\.lrr: unknown config key \(did you mean rl\.lr\? known in this"):
        render_docs("rl.lrr")
    with pytest.raises(ConfigError, match=r"^rll: unknown config key \(did you mean rl\?"):
        render_docs("rll.lr")
    every = render_docs()
    assert every.startswith("[top level]\nrun_dir: str") and "\n[weight_sync]\n" in every


def test_rules_moved_into_the_config_are_said_when_it_loads():
    with pytest.raises(ConfigError, match="learner.offload_optimizer is DeepSpeed ZeRO's CPU offload"):
        load_config(None, ["learner.backend=fsdp2", "learner.offload_optimizer=true"])  # was FSDP2Learner.__init__
    with pytest.raises(ConfigError, match="rl.loss_tokens=action does not combine"):  # was train.py
        load_config(None, ["rl.loss_tokens=action", "reward.self_certainty.source=update_logits"])
    with pytest.raises(ConfigError, match=r"reward\.fn='no_colon': expected 'package.module:function'"):  # worker
        load_config(None, ["reward.fn=no_colon"])


@pytest.mark.parametrize("stage, overrides, named", [
    ("pipeline", [], "data.sessions_path is empty"),
    ("pipeline", ["data.synthetic=true", "rl.val_every=5"], "rl.val_every > 0 needs a validation split"),
    ("pipeline", ["data.synthetic=true", "eval.split=val"], "eval.split=val needs a validation split"),
    ("train", ["reward.self_certainty.source=topk_logprobs"], "needs rollout.temperature=1"),
    ("pipeline", ["data.synthetic=true", "reward.self_certainty.source=topk_logprobs"], "rollout.temperature=1"),
    ("train", ["weight_sync.transport=direct"], "runs only with ray.local_mode=true"),
    ("train", ["weight_sync.transport=gloo", "ray.local_mode=true"], "forms a process group of Ray actors"),
])
def test_validate_runs_the_rules_of_the_stage(stage, overrides, named):
    cfg = load_config(None, overrides)  # the config alone is fine: these rules need the stage
    with pytest.raises(ConfigError, match=named):
        validate(cfg, stage)
    for other in {"sft", "eval"}:
        validate(cfg, other)


def test_validate_checks_the_context_budget_and_the_prompts_when_given_them():
    cfg = load_config(None, ["data.max_prompt_tokens=1000", "rollout.max_new_tokens=100", "sft.max_seq_len=900"])
    validate(cfg, "train", max_model_len=1100)
    with pytest.raises(ConfigError, match=r"data\.max_prompt_tokens=1000 \+ rollout\.max_new_tokens=100"):
        validate(cfg, "train", max_model_len=1099)
    validate(cfg, "sft", max_model_len=900)  # only SFT's budget
    cfg.rl.val_every, cfg.reward.click_guard = 4, True
    prompt = Prompt("ex", (1,), Action("terminate"))
    with pytest.raises(ConfigError) as err:
        validate(cfg, "train", prompts=[prompt], local=True)
    assert str(err.value).splitlines()[0].startswith("rl.val_every=4 needs validation prompts")
    assert "reward.click_guard=true needs each prompt's page_names" in str(err.value)  # every rule, one error
    named = Prompt("ex", (1,), Action("terminate"), page_names=("a.b",))
    validate(cfg, "train", prompts=[named], val_prompts=[named], local=True)

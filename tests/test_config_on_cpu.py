"""Config: the paper's defaults, YAML + dotted overrides, range checks, and errors that name the key."""

import ast
import dataclasses
import math
import typing
from pathlib import Path

import pytest
import yaml

import shop_r1.config as config_module
from shop_r1.config import RANGES, Config, ConfigError, Range, check_ranges, load_config, save_config

REPO = Path(__file__).resolve().parents[1]


def test_defaults_are_the_papers():
    cfg = load_config()
    assert cfg.reward.dars_factor == 1000.0
    assert cfg.reward.alpha == 0.005
    assert cfg.rl.kl_beta == 0.001
    assert cfg.reward.rouge_threshold == 0.75
    assert cfg.rollout.temperature == 0.6
    assert cfg.rl.global_batch_size == 64 and cfg.sft.global_batch_size == 64
    assert (cfg.sft.epochs, cfg.sft.lr) == (4, 2e-5)
    assert (cfg.rl.steps, cfg.rl.lr) == (500, 1e-7)
    assert cfg.data.max_prompt_tokens == 32768 and cfg.model.max_context_tokens == 32768


def test_yaml_then_dotted_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("reward:\n  dars_factor: 10\n  self_certainty:\n    direction: u_to_p\nrl:\n  steps: 3\n")
    cfg = load_config(path, ["reward.dars_factor=1", "data.context=latest_step", "reward.format_reward=false",
                             "rl.lr=1e-6"])
    assert cfg.reward.dars_factor == 1.0  # the override wins over the file
    assert isinstance(cfg.reward.dars_factor, float)  # an int literal is accepted for a float field
    assert cfg.reward.self_certainty.direction == "u_to_p"
    assert cfg.rl.steps == 3 and cfg.rl.lr == 1e-6
    assert cfg.data.context == "latest_step" and cfg.reward.format_reward is False


@pytest.mark.parametrize("override, named", [
    ("reward.dars=1", "reward.dars"),                     # unknown key
    ("rewards.dars_factor=1", "rewards"),                 # unknown section
    ("rl.steps=ten", "rl.steps"),                         # wrong type
    ("rl.steps=1.5", "rl.steps"),                         # a float for an int
    ("reward.format_reward=1", "reward.format_reward"),   # an int for a bool
    ("data.context=everything", "data.context"),          # not one of the Literal's values
    ("reward.self_certainty=3", "reward.self_certainty"),  # a value for a section
    ("reward.dars_factor", "reward.dars_factor"),         # no '='
])
def test_bad_overrides_name_the_key(override, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, [override])


def test_unknown_key_in_yaml_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  temprature: 0.7\n")
    with pytest.raises(ConfigError, match=r"rollout\.temprature"):
        load_config(path)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["seed=7", "reward.action_reward=binary"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert isinstance(cfg, Config)


def test_derived_dars_follows_the_scale_switch():
    assert load_config(None, ["reward.reward_scale=false"]).reward.effective_dars == 1.0
    assert load_config().reward.effective_dars == 1000.0


def test_every_shipped_config_loads():
    files = [*sorted((REPO / "configs").rglob("*.yaml")), *sorted((REPO / "experiments" / "configs").glob("*.yaml"))]
    assert len(files) >= 13
    for f in files:
        check_ranges(load_config(f))  # an unknown key, a wrong type or a value out of range would raise, naming it


# ---------------------------------------------------------------------------------------------- ranges


def test_defaults_are_in_range():
    check_ranges(Config())
    assert Config().rl.keep_checkpoints == 2


@pytest.mark.parametrize("override, allowed", [
    ("rollout.group_size=1", ">= 2"),                   # GRPO needs a group
    ("learner.zero_stage=4", "in [0, 3]"),
    ("learner.zero_stage=-1", "in [0, 3]"),
    ("rl.global_batch_size=0", ">= 1"),
    ("sft.epochs=0", ">= 1"),
    ("data.max_prompt_tokens=-5", ">= 1"),
    ("data.test_max_prompt_tokens=-1", ">= 0"),         # 0 is allowed ("the same as max_prompt_tokens")
    ("rl.lr=0", "> 0"),
    ("sft.lr=-2e-5", "> 0"),
    ("rollout.temperature=0", "> 0"),                   # rollouts sample ...
    ("eval.temperature=-0.1", ">= 0"),                  # ... evaluation may be greedy
    ("data.test_fraction=0", "in (0, 1)"),
    ("data.test_fraction=1", "in (0, 1)"),
    ("rollout.gpu_memory_utilization=0", "in (0, 1]"),
    ("rollout.gpu_memory_utilization=1.2", "in (0, 1]"),
    ("reward_pool.max_failed_fraction=1.5", "in [0, 1]"),
    ("sft.warmup_ratio=1", "in [0, 1)"),
    ("reward_pool.timeout_s=0", "> 0"),
    ("rollout.kv_cache_gib=0", "> 0"),
    ("rl.clip_eps=0", "in (0, 1)"),
    ("rl.clip_eps_high=1", "in [0, 1)"),
    ("rl.kl_beta=-0.001", ">= 0"),
    ("reward.alpha=-1", ">= 0"),
    ("reward.dars_factor=0", "> 0"),
    ("reward.rouge_threshold=1.01", "in [0, 1]"),
    ("learner.grad_clip=0", "> 0"),
    ("learner.num_gpus_per_rank=-1", ">= 0"),
    ("data.balance_ratio=0.9", ">= 1"),
    ("rl.num_minibatches=0", ">= 1"),
    ("rl.keep_checkpoints=0", ">= 1"),
    ("ray.num_cpus=-1", ">= 0"),
    ("rl.lr=.nan", "> 0"),                              # NaN is in no range
])
def test_out_of_range_names_key_value_and_range(override, allowed):
    key, text = override.split("=")
    value = yaml.safe_load(text)
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    msg = str(err.value)
    # The message names the key, the value (as the field holds it: 0 -> 0.0 for a float field) and the range.
    assert f"{key}={value!r} is out of range: allowed {allowed}" in msg \
        or f"{key}={float(value)!r} is out of range: allowed {allowed}" in msg, msg


@pytest.mark.parametrize("override", ["data.test_max_prompt_tokens=0", "eval.max_examples=0", "ray.num_cpus=0",
                                      "eval.temperature=0", "rl.kl_beta=0", "reward.alpha=0", "rl.clip_eps_high=0",
                                      "reward_pool.max_failed_fraction=1", "reward_pool.num_cpus_per_worker=0",
                                      "rollout.gpu_memory_utilization=1", "learner.zero_stage=3",
                                      "rollout.top_k_logprobs=0", "logging.console_every=0", "rl.keep_checkpoints=1",
                                      "rollout.group_size=2"])
def test_range_edges_that_are_allowed(override):
    load_config(None, [override, "rl.global_batch_size=64"])


def test_every_violation_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rl.steps=0", "sft.lr=0", "learner.zero_stage=7"])
    lines = str(err.value).splitlines()
    assert sorted(ln.split("=")[0] for ln in lines) == ["learner.zero_stage", "rl.steps", "sft.lr"]


def test_batch_must_be_a_multiple_of_the_group():
    with pytest.raises(ConfigError, match=r"rl\.global_batch_size=10 .*rollout\.group_size=4"):
        load_config(None, ["rollout.group_size=4", "rl.global_batch_size=10"])
    assert load_config(None, ["rollout.group_size=4", "rl.global_batch_size=12"]).rl.global_batch_size == 12


def test_gpus_per_engine_must_match_tensor_parallel_size():
    """The weight-sync backend is read from the placement (NCCL only with whole GPUs per party), so an engine's
    GPUs must be what its tensor-parallel workers take."""
    with pytest.raises(ConfigError, match=r"rollout\.num_gpus_per_engine=2 must equal rollout\.tensor_parallel_size=1"):
        load_config(None, ["rollout.num_gpus_per_engine=2"])
    assert load_config(None, ["rollout.num_gpus_per_engine=2", "rollout.tensor_parallel_size=2"]).rollout.\
        num_gpus_per_engine == 2
    assert load_config(None, ["rollout.num_gpus_per_engine=0.5"]).rollout.num_gpus_per_engine == 0.5  # shared card
    assert load_config(None, []).rollout.num_gpus_per_engine == 0  # CPU


def test_check_ranges_on_a_config_built_in_code():
    cfg = Config()
    cfg.rollout.group_size = 1
    cfg.rl.clip_eps = 1.5
    with pytest.raises(ConfigError) as err:
        check_ranges(cfg)
    assert "rollout.group_size=1 is out of range: allowed >= 2" in str(err.value)
    assert "rl.clip_eps=1.5 is out of range: allowed in (0, 1)" in str(err.value)
    # The cross rule is left out while one of its keys is itself out of range (no modulo by a bad group size).
    assert "multiple" not in str(err.value)
    cfg = Config()
    cfg.rl.steps = "10"  # a wrong type slipped in by code, not YAML
    with pytest.raises(ConfigError, match=r"rl\.steps='10': expected a number >= 1"):
        check_ranges(cfg)


def test_range_text():
    assert [str(r) for r in (Range(2), Range(0, low_open=True), Range(0, 1), Range(0, 1, low_open=True),
                             Range(0, 1, high_open=True), Range(0, 1, True, True), Range(high=3))] == \
        [">= 2", "> 0", "in [0, 1]", "in (0, 1]", "in [0, 1)", "in (0, 1)", "<= 3"]
    assert 0 in Range(0) and 0 not in Range(0, low_open=True)
    assert 1 in Range(0, 1) and 1 not in Range(0, 1, high_open=True)
    assert math.nan not in Range(0)  # noqa: PLW0177 -- `in` calls Range.__contains__, which must reject NaN
    assert math.inf in Range(0, low_open=True)


def _numeric_fields(cls=Config, prefix=""):
    for f in dataclasses.fields(cls):
        tp, key = typing.get_type_hints(cls)[f.name], prefix + f.name
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, key + ".")
        elif tp in (int, float):
            yield key, cls, f.name


def _field_docstrings():
    """{(class name, field name): docstring} read from config.py's source (attribute docstrings)."""
    tree = ast.parse(Path(config_module.__file__).read_text())
    docs = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for a, b in zip(node.body, node.body[1:]):
                if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                    docs[(node.name, a.target.id)] = " ".join(b.value.value.split())
    return docs


def test_every_numeric_field_has_a_range_and_its_docstring_states_it():
    docs = _field_docstrings()
    numeric = {key: (cls, name) for key, cls, name in _numeric_fields()}
    assert set(RANGES) <= set(numeric), set(RANGES) - set(numeric)      # no stale keys in the table
    assert set(numeric) - set(RANGES) == {"seed", "data.synth_seed"}  # seeds: any int
    for key, allowed in RANGES.items():
        cls, name = numeric[key]
        assert f"Range: {allowed}" in docs.get((cls.__name__, name), ""), f"{key}: docstring lacks 'Range: {allowed}'"

"""Config: the paper's defaults, YAML + dotted overrides, range checks, and errors that name the key."""

import ast
import contextlib
import dataclasses
import math
import typing
from pathlib import Path

import pytest
import yaml

import shop_r1.config as config_module
from shop_r1.config import (
    MAX_TOP_K_LOGPROBS,
    RANGES,
    Config,
    ConfigError,
    Range,
    check_context_budget,
    check_ranges,
    load_config,
    save_config,
)

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
    assert cfg.data.max_prompt_tokens == 32512 and cfg.model.max_context_tokens == 32768


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
    ("rollout.top_k_logprobs=21", "in [0, 20]"),        # vLLM's default max_logprobs
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
                                      "rollout.group_size=2", "rollout.top_k_logprobs=20"])
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
    assert math.inf not in Range(0, low_open=True)  # an open end means any *finite* number
    assert -math.inf not in Range(high=3)
    assert 1e308 in Range(0) and 10**400 in Range(1)  # large finite numbers (a huge int is not a float) are fine


def _numeric_fields(cls=Config, prefix=""):
    for f in dataclasses.fields(cls):
        tp, key = typing.get_type_hints(cls)[f.name], prefix + f.name
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, key + ".")
        elif tp in (int, float):
            yield key, cls, f.name


def _field_docstrings():
    """{(class name, field name): docstring} read from the config package's sources (attribute docstrings)."""
    docs = {}
    for path in sorted(Path(config_module.__file__).parent.glob("*.py")):
        docs.update(_module_field_docstrings(path))
    return docs


def _module_field_docstrings(path):
    tree = ast.parse(path.read_text())
    docs = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for a, b in zip(node.body, node.body[1:]):
                if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                    docs[(node.name, a.target.id)] = " ".join(b.value.value.split())
    return docs


def test_every_numeric_field_declares_its_range_on_itself():
    numeric = {key: (cls, name) for key, cls, name in _numeric_fields()}
    declared = {key: f.metadata["range"] for key, (cls, name) in numeric.items()
                for f in dataclasses.fields(cls) if f.name == name and "range" in f.metadata}
    assert set(numeric) - set(declared) == {"seed", "data.synth_seed"}  # seeds: any int
    assert RANGES == declared  # the validator's view is the fields' own, nothing else
    # The bound is stated once, on the field: no docstring repeats it (it would drift).
    assert not [key for key, doc in _field_docstrings().items() if "Range:" in doc]


def test_bounded_refuses_a_default_out_of_its_range_and_two_bounds_on_one_side():
    assert config_module.bounded(0.5, gt=0, lt=1).metadata["range"] == Range(0, 1, low_open=True, high_open=True)
    with pytest.raises(ValueError, match=r"the default 0 is not >= 1"):
        config_module.bounded(0, ge=1)
    with pytest.raises(TypeError, match="at most one lower bound"):
        config_module.bounded(1, ge=0, gt=0)


def test_the_cross_field_rules_are_one_function():
    cfg = Config()
    cfg.rl.global_batch_size, cfg.rollout.num_gpus_per_engine = 10, 2.0
    assert config_module.cross_field_problems(cfg) == [
        "rl.global_batch_size=10 is not a multiple of rollout.group_size=8: a rollout batch is P prompts x G samples "
        "(e.g. rl.global_batch_size=8)",
        "rollout.num_gpus_per_engine=2 must equal rollout.tensor_parallel_size=1: an engine holds one GPU per "
        "tensor-parallel worker (a fraction below 1 shares one card)"]
    assert config_module.cross_field_problems(cfg, bad={"rollout.group_size", "rollout.tensor_parallel_size"}) == []


@pytest.mark.parametrize("gpus, backend, named", [
    (0.0, "deepspeed", ["num_gpus_per_rank > 0"]),
    (1.0, "fsdp2", ["learner.backend=deepspeed only"]),
    (0.0, "fsdp2", ["num_gpus_per_rank > 0", "learner.backend=deepspeed only"]),
    (1.0, "deepspeed", []),
])
def test_flex_attention_needs_gpu_ranks_and_the_deepspeed_backend(gpus, backend, named):
    cfg = Config()
    cfg.learner.attention, cfg.learner.num_gpus_per_rank, cfg.learner.backend = "flex", gpus, backend
    problems = config_module.cross_field_problems(cfg)
    assert len(problems) == len(named)
    assert all(n in p and "learner.attention=flex" in p for n, p in zip(named, problems))
    with pytest.raises(ConfigError, match="learner.attention=flex") if named else contextlib.nullcontext():
        load_config(None, ["learner.attention=flex", f"learner.num_gpus_per_rank={gpus}", f"learner.backend={backend}"])


@pytest.mark.parametrize("gpus", [0.0, 1.0])
@pytest.mark.parametrize("backend", ["deepspeed", "fsdp2"])
def test_split_attention_is_the_default_on_any_ranks_and_backend(gpus, backend):
    cfg = load_config(None, [f"learner.num_gpus_per_rank={gpus}", f"learner.backend={backend}"])
    assert cfg.learner.attention == "split" and config_module.cross_field_problems(cfg) == []


# ---------------------------------------------------------------------------------------------- issue 22: hardening


_FLOAT_KEYS = [key for key, cls, name in _numeric_fields() if typing.get_type_hints(cls)[name] is float]


@pytest.mark.parametrize("text, shown", [(".inf", "inf"), ("-.inf", "-inf"), (".nan", "nan"), ("inf", "inf"),
                                         ("1e999", "inf")])  # YAML's spellings, a bare word, and an overflow
@pytest.mark.parametrize("key", _FLOAT_KEYS)
def test_every_float_field_refuses_non_finite_numbers(key, text, shown):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}={text}"])
    assert f"{key}={shown} is not a finite number: allowed {RANGES[key]}" in str(err.value)


def test_float_keys_cover_the_fields_that_used_to_take_inf():
    # "> 0" and ">= 0" fields took inf before issue 22 (rates, timeouts, Ray resources): they are among the checked.
    assert {"rl.lr", "rollout.generate_timeout_s", "reward_pool.timeout_s", "rollout.num_cpus_per_engine",
            "rl.async_is_cap", "reward.dars_factor", "data.synth_noise"} <= set(_FLOAT_KEYS)


def test_non_finite_in_a_config_built_in_code():
    cfg = Config()
    cfg.rl.kl_beta = math.inf
    with pytest.raises(ConfigError, match=r"rl\.kl_beta=inf is not a finite number: allowed >= 0"):
        check_ranges(cfg)


def test_top_k_logprobs_bound_is_vllms_default():
    assert MAX_TOP_K_LOGPROBS == 20 and RANGES["rollout.top_k_logprobs"] == Range(0, 20)


def test_every_probability_and_share_is_at_most_one():
    for key in ("data.synth_noise", "data.val_fraction", "data.test_fraction", "reward.rouge_threshold",
                "reward_pool.max_failed_fraction", "rollout.gpu_memory_utilization", "sft.warmup_ratio",
                "rl.clip_eps", "rl.clip_eps_high"):
        assert RANGES[key].high == 1, key
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"{key}=1.5"])
        assert f"{key}=1.5 is out of range" in str(err.value)


@pytest.mark.parametrize("gpus, tp", [(2, 4), (1, 2), (0.5, 2)])
def test_tensor_parallel_size_at_most_the_gpus_per_engine(gpus, tp):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"rollout.num_gpus_per_engine={gpus}", f"rollout.tensor_parallel_size={tp}"])
    assert f"rollout.tensor_parallel_size={tp} is more than the GPUs an engine holds " \
           f"(rollout.num_gpus_per_engine={gpus:g}): each tensor-parallel worker needs a GPU of its own; " \
           f"set rollout.num_gpus_per_engine={tp}" in str(err.value)


def test_tensor_parallel_size_on_cpu_is_not_checked():
    # On CPU (no GPUs per engine) each engine is one process and the engine ignores tensor_parallel_size.
    assert load_config(None, ["rollout.tensor_parallel_size=2"]).rollout.tensor_parallel_size == 2


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home directory of the test's own (Path.home() reads HOME)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize("run_dir, what", [("/", "the filesystem root"), ("/tmp/..", "the filesystem root"),
                                           ("~", "the home directory"), ("~/", "the home directory"),
                                           ("HOME", "the home directory"), ("HOME/runs/..", "the home directory"),
                                           ("LINK", "the home directory")])
def test_run_dir_is_not_root_or_home(home, tmp_path, run_dir, what):
    (tmp_path / "link").symlink_to(home)
    run_dir = run_dir.replace("HOME", str(home)).replace("LINK", str(tmp_path / "link"))
    cfg = Config(run_dir=run_dir)
    with pytest.raises(ConfigError) as err:
        check_ranges(cfg)
    shown = "/" if what == "the filesystem root" else str(home)
    assert f"run_dir={run_dir!r} resolves to {shown} ({what}): every stage writes into the run folder and " \
           "storage_uri copies it whole; give the run a folder of its own, e.g. run_dir=runs/NAME" in str(err.value)


def test_relative_run_dir_resolves_from_the_working_directory(home, monkeypatch):
    monkeypatch.chdir(home)
    with pytest.raises(ConfigError, match=r"run_dir='\.' resolves to .* \(the home directory\)"):
        check_ranges(Config(run_dir="."))
    check_ranges(Config(run_dir="runs/x"))  # a folder under home is fine


@pytest.mark.parametrize("run_dir", ["", "  "])
def test_run_dir_is_not_empty(run_dir, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"run_dir: '{run_dir}'\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"run_dir={run_dir!r} is empty: give the run's own folder, e.g. run_dir=runs/NAME" in str(err.value)


def test_run_dir_from_yaml_is_checked(home, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run_dir: '~'\n")  # quoted: a bare ~ is YAML's null (a type error naming run_dir)
    with pytest.raises(ConfigError, match=r"run_dir='~' resolves to .*\(the home directory\)"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"run_dir: expected a string, got None"):
        load_config(None, ["run_dir=~"])


def test_only_keys_where_empty_means_unset_take_an_empty_value():
    assert load_config(None, ["ray.address="]).ray.address == ""  # YAML's null: the empty string
    with pytest.raises(ConfigError, match=r"model.path: expected a string, got None"):
        load_config(None, ["model.path="])  # `model.path=$MODEL` with MODEL unset: refused, not the default model


# Budgets: training prompts 1000 + answers 100 = 1100; held-out prompts 900 + eval answers 50 = 950; SFT 1024.
BUDGET = ["data.max_prompt_tokens=1000", "rollout.max_new_tokens=100", "data.test_max_prompt_tokens=900",
          "eval.max_new_tokens=50", "sft.max_seq_len=1024", "model.max_context_tokens=2048"]


def test_context_budget_that_fits():
    check_context_budget(load_config(None, BUDGET), 1100)  # 1000 + 100 = 1100 <= 1100, 950 <= 1100, 1024 <= 1100


def test_context_budget_names_the_keys_to_change():
    with pytest.raises(ConfigError) as err:
        check_context_budget(load_config(None, BUDGET), 1000)
    lines = str(err.value).splitlines()
    context = "the model's context of 1000 tokens (model.max_context_tokens=2048, capped by the model's own positions)"
    assert lines == [
        # 1000 + 100 = 1100 > 1000: the prompt budget may be 1000 - 100 = 900
        f"data.max_prompt_tokens=1000 + rollout.max_new_tokens=100 = 1100 tokens do not fit {context}: "
        "set data.max_prompt_tokens <= 900 or lower rollout.max_new_tokens",
        # the held-out set: 900 + 50 = 950 fits; SFT: 1024 > 1000
        f"sft.max_seq_len=1024 does not fit {context}: set sft.max_seq_len <= 1000"]


def test_context_budget_of_the_held_out_set_falls_back_to_the_training_budget():
    cfg = load_config(None, [*BUDGET, "data.test_max_prompt_tokens=0"])  # 0: data.max_prompt_tokens (1000)
    with pytest.raises(ConfigError) as err:
        check_context_budget(cfg, 1040, stages=("eval",))  # 1000 + 50 = 1050 > 1040; the rl pair is not checked
    assert str(err.value) == (
        "data.max_prompt_tokens=1000 + eval.max_new_tokens=50 = 1050 tokens do not fit the model's context of 1040 "
        "tokens (model.max_context_tokens=2048, capped by the model's own positions): set data.max_prompt_tokens "
        "<= 990 or lower eval.max_new_tokens")


def test_context_budget_of_validation_answers():
    # rl.val_every > 0: validation prompts (the held-out budget, 900) are answered with rollout.max_new_tokens (100).
    cfg = load_config(None, [*BUDGET, "data.max_prompt_tokens=800", "rl.val_every=5"])
    check_context_budget(cfg, 1000, stages=("rl",))  # 800 + 100 and 900 + 100 both fit 1000
    with pytest.raises(ConfigError, match=r"^data\.test_max_prompt_tokens=900 \+ rollout\.max_new_tokens=100 = 1000 "
                                          r"tokens do not fit .*: set data\.test_max_prompt_tokens <= 899 or lower "
                                          r"rollout\.max_new_tokens$"):
        check_context_budget(cfg, 999, stages=("rl",))


def test_context_budget_answer_alone_too_long():
    cfg = load_config(None, [*BUDGET, "rollout.max_new_tokens=1200"])
    with pytest.raises(ConfigError, match=r"lower rollout\.max_new_tokens below 1100 \(and data\.max_prompt_tokens "
                                          r"to fit the rest\)"):
        check_context_budget(cfg, 1100, stages=("rl",))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_context_budget_needs_a_context_length(bad):
    with pytest.raises(ValueError, match="max_model_len"):
        check_context_budget(Config(), bad)


def test_shipped_small_model_configs_fit_their_models():
    # demo_cpu: the from-scratch model (model.max_context_tokens=4096); demo_smollm2_cpu: SmolLM2's 8192 positions.
    check_context_budget(load_config(REPO / "configs" / "demo_cpu.yaml"), 4096)
    check_context_budget(load_config(REPO / "configs" / "demo_smollm2_cpu.yaml"), 8192, stages=("rl", "eval", "sft"))

"""Typed configuration: dataclasses are the schema, YAML files hold overrides, the CLI takes dotted overrides.

    cfg = load_config("configs/shop_r1.yaml", ["reward.dars_factor=1", "rl.steps=10"])
    validate(cfg, "train", max_model_len=4096, prompts=prompts)  # once, before any actor starts

Defaults are the paper's (section 4.1). One module per section owns its fields, each field's bound (declared on the
field itself: `group_size: int = bounded(8, ge=2)`), its doc (the docstring under it; `shop-r1 config show --doc
KEY`) and its cross-field rules (the module's `problems`):

    rl · rollout · learner · reward · data · model · sft · eval · logging · weight_sync · cluster (ray, reward_pool)

`core` holds the root `Config`, `check_ranges` (every rule the config alone decides: `load_config` runs it) and the
loading; `validate` adds the rules that need the stage, the model's context or the prompts. An unknown key, a value
of the wrong type, a number out of its range or a broken rule is a `ConfigError` naming the dotted key. Each
component receives only its slice (`cfg.reward`, ...). Pure: nothing here imports ray, vllm or deepspeed.
"""

from shop_r1.config.cluster import (
    CPU_LIST_KEYS,
    PLACEMENT_KEYS,
    RAY_RESOURCE_UNIT,
    RayConfig,
    RewardPoolConfig,
    parse_cpu_cores,
    parse_resources,
)
from shop_r1.config.core import (
    EMPTY_MEANS_UNSET,
    RANGES,
    RENAMED,
    Config,
    check_ranges,
    config_to_dict,
    cross_field_problems,
    describe,
    load_config,
    save_config,
)
from shop_r1.config.data import DataConfig, check_sessions_source
from shop_r1.config.eval import EvalConfig
from shop_r1.config.fields import ConfigError, Range, bounded
from shop_r1.config.learner import LearnerConfig
from shop_r1.config.logging import LoggingConfig
from shop_r1.config.model import ModelConfig
from shop_r1.config.reward import RewardConfig, RewardFunctionConfig, SelfCertaintyConfig
from shop_r1.config.rl import AdvantageConfig, LossConfig, LossVariant, RLConfig
from shop_r1.config.rollout import MAX_TOP_K_LOGPROBS, RolloutConfig
from shop_r1.config.sft import SFTConfig
from shop_r1.config.validate import check_context_budget, validate
from shop_r1.config.weight_sync import TRANSPORTS, WeightSyncConfig, WeightSyncTransport

__all__ = [
    "CPU_LIST_KEYS", "EMPTY_MEANS_UNSET", "MAX_TOP_K_LOGPROBS", "PLACEMENT_KEYS", "RANGES", "RAY_RESOURCE_UNIT",
    "RENAMED", "TRANSPORTS", "AdvantageConfig", "Config", "ConfigError", "DataConfig", "EvalConfig", "LearnerConfig",
    "LoggingConfig", "LossConfig", "LossVariant", "ModelConfig", "RLConfig", "Range", "RayConfig", "RewardConfig",
    "RewardFunctionConfig", "RewardPoolConfig", "RolloutConfig", "SFTConfig", "SelfCertaintyConfig", "WeightSyncConfig",
    "WeightSyncTransport", "bounded", "check_context_budget", "check_ranges", "check_sessions_source",
    "config_to_dict", "cross_field_problems", "describe", "load_config", "parse_cpu_cores", "parse_resources",
    "save_config", "validate",
]

"""The root `Config` (every section), its checks and its loading: defaults <- YAML (sparse) <- dotted overrides.

`check_ranges` runs every rule the config alone decides: each numeric field's bound (declared on the field,
`bounded`), each section's cross-field rules (its module's `problems`, gathered by `cross_field_problems`) and the
run folder's. `load_config` runs it; the rules that need more than the config run in `validate`."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shop_r1.config import cluster, data, learner, reward, rl, rollout
from shop_r1.config.cluster import CPU_LIST_KEYS, RayConfig, RewardPoolConfig
from shop_r1.config.data import DataConfig
from shop_r1.config.eval import EvalConfig
from shop_r1.config.fields import ConfigError, Range
from shop_r1.config.learner import LearnerConfig
from shop_r1.config.logging import LoggingConfig
from shop_r1.config.model import ModelConfig
from shop_r1.config.reward import RewardConfig
from shop_r1.config.rl import RLConfig
from shop_r1.config.rollout import RolloutConfig
from shop_r1.config.sft import SFTConfig
from shop_r1.config.weight_sync import WeightSyncConfig

RENAMED: dict[str, tuple[str, dict[Any, Any]]] = {
    "rl.loss_aggregation": ("rl.loss", {"token": "dapo", "sequence": "grpo"}),
}
"""Keys replaced by another: old key -> (new key, old value -> new value). Loading an old key is refused naming the
new one; a resumed run's config.yaml is read through it (shop_r1/run_config.py)."""


@dataclass
class Config:
    run_dir: str = "runs/default"
    """Where every artefact of a run goes (resolved config, data, models, metrics, checkpoints). On a multi-node
    cluster: a path every node sees (shared filesystem), since learner ranks write checkpoint shards there. Not empty,
    and not (nor a link to) `/` or the home directory: every stage writes into it and `storage_uri` copies it whole."""
    storage_uri: str = ""
    """Optional mirror of the run folder (s3://bucket/prefix, gs://..., file:///...), copied after every checkpoint
    and stage (shop_r1/storage.py). Empty: the run folder is the only copy."""
    seed: int = 0
    """Seed of the run: data split, sampling, initialisation (any int)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    reward_pool: RewardPoolConfig = field(default_factory=RewardPoolConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)


def _field_ranges(cls: type, prefix: str = "") -> dict[str, Range]:
    """Every bounded field's allowed values, by dotted key, read from the fields' metadata (`bounded`)."""
    hints, out = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(_field_ranges(hints[f.name], f"{prefix}{f.name}."))
        elif "range" in f.metadata:
            out[prefix + f.name] = f.metadata["range"]
    return out


RANGES: dict[str, Range] = _field_ranges(Config)
"""Every int/float field's allowed values, by dotted key, derived from the fields (`bounded`): not a table to edit.
Seeds (`seed`, `data.synth_seed`) take any int and are the only numeric fields without one. No range holds inf, -inf
or NaN, so every float field refuses them. Probabilities, shares and ratios are bounded by 1."""


def _get(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _run_dir_problems(run_dir: str) -> list[str]:
    """`run_dir` is written into by every stage and copied whole to `storage_uri`: refuse an empty one and one that
    is, or resolves to (`..`, a link, `~`), the filesystem root or the home directory."""
    if not run_dir.strip():
        return [f"run_dir={run_dir!r} is empty: give the run's own folder, e.g. run_dir=runs/NAME"]
    # The runs use Path(run_dir) as written (a literal `~` would be a folder named `~`); check both readings.
    resolved = {Path(run_dir).resolve(), Path(run_dir).expanduser().resolve()}
    forbidden = {Path("/").resolve(): "the filesystem root"}
    try:
        forbidden[Path.home().resolve()] = "the home directory"
    except RuntimeError:  # no home directory can be determined: nothing to compare with
        pass
    return [f"run_dir={run_dir!r} resolves to {path} ({what}): every stage writes into the run folder and "
            "storage_uri copies it whole; give the run a folder of its own, e.g. run_dir=runs/NAME"
            for path, what in forbidden.items() if path in resolved]


def cross_field_problems(cfg: Config, bad: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The broken cross-field rules of every section (each module's `problems`), one line each; a rule one of whose
    keys is in `bad` (itself out of range) is left out (no modulo by a bad group size)."""
    return [p for section in (data, rl, rollout, cluster, learner, reward) for p in section.problems(cfg, bad)]


def check_ranges(cfg: Config) -> None:
    """Raise one `ConfigError` listing every numeric field out of its range (dotted key, value, allowed range),
    the malformed placement fields (`PLACEMENT_KEYS`) and the cross-field rules (`cross_field_problems`).
    `load_config` runs it; code that builds or edits a `Config` itself should too."""
    problems, bad = [], set()
    for key, allowed in RANGES.items():
        value = _get(cfg, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{key}={value!r}: expected a number {allowed}")
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{key}={value!r} is not a finite number: allowed {allowed}")
        elif value not in allowed:
            problems.append(f"{key}={value!r} is out of range: allowed {allowed}")
        else:
            continue
    problems.extend(cross_field_problems(cfg, bad))
    problems.extend(_run_dir_problems(cfg.run_dir))
    if problems:
        raise ConfigError("\n".join(problems))


# ---------------------------------------------------------------------------------------------- loading


EMPTY_MEANS_UNSET = frozenset({"ray.address", "rollout.resources", "learner.resources", "reward_pool.resources",
                               "rollout.cpu_cores", "learner.cpu_cores", "logging.wandb_entity", "logging.run_name"})
"""String keys that may be given empty (`ray.address=`): YAML reads that as null, taken as "". Any other key stays
refused (`model.path=$MODEL` with MODEL unset must not quietly mean the embedded default)."""


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`, converting where YAML/CLI text is unambiguous."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key}: expected one of {typing.get_args(tp)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, arm, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: {value!r} fits none of {tp}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping for section {tp.__name__}, got {value!r}")
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected a bool, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an int, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-7` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a float, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if value is None and key in EMPTY_MEANS_UNSET:  # `ray.address=`: YAML reads an empty value as null
            return ""
        if key in CPU_LIST_KEYS and isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # `rollout.cpu_cores=0`: YAML reads a one-core list as a number
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (arm,) = typing.get_args(tp)[:1]
        return type(value)(_coerce(v, arm, f"{key}[{i}]") for i, v in enumerate(value)) if origin is list \
            else tuple(_coerce(v, arm, f"{key}[{i}]") for i, v in enumerate(value))
    raise ConfigError(f"{key}: unsupported field type {tp}")


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names and key in RENAMED:
            new, values = RENAMED[key]
            mapping = ", ".join(f"{key}={a} is {new}={b}" for a, b in values.items())
            raise ConfigError(f"{key}: replaced by {new} ({mapping})")
        if k not in names:
            import difflib

            close = difflib.get_close_matches(str(k), sorted(names), n=1)
            hint = f"did you mean {prefix + '.' if prefix else ''}{close[0]}? " if close else ""
            raise ConfigError(f"{key}: unknown config key ({hint}known in this section: {sorted(names)})")
        kwargs[k] = _coerce(v, hints[k], key)
    return cls(**kwargs)


def _parse_scalar(text: str) -> Any:
    """CLI values are YAML scalars: `1`, `1e-7`, `true`, `whole_session`, `"quoted"`, `[1, 2]`."""
    import yaml

    return yaml.safe_load(text)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {p} is a value, not a section")
        node = child
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults <- YAML file (sparse) <- dotted `key=value` overrides, validated against the dataclasses (keys, types)
    and `check_ranges` (the fields' bounds, the cross-field rules)."""
    import yaml

    tree: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:  # missing, a folder, unreadable: the user's path, named
            raise ConfigError(f"--config {path}: cannot read it ({exc.strerror or exc})") from exc
        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            line = f":{where.line + 1}" if where is not None else ""
            raise ConfigError(f"{path}{line}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of config sections")
        tree = loaded
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), _parse_scalar(raw))
    cfg = _build(Config, tree)
    check_ranges(cfg)
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    """The resolved config goes into every run folder, as YAML (readable) that `load_config` reads back."""
    import yaml

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def describe(cfg: Config) -> str:
    return json.dumps(config_to_dict(cfg), indent=2)

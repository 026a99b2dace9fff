"""The main job, `shop-r1 pipeline`: the whole method on the configured setup, stage by stage.

    model -> sessions -> examples -> zero-shot eval -> SFT -> eval -> GRPO (Shop-R1) -> eval -> Table 2-style table

Every artefact lands in `run_dir`, starting with the resolved config. Ray is started (or attached to) once for all
stages; each stage builds its workers and gives them back when done, so the engines and the learner never hold
memory at the same time on a small machine.

Re-running the same command on the same run folder (after a kill, a lost machine, a crash) continues the run: every
stage is recorded in RUN/stages.json with a key over its config slice, its outside inputs and the stages it reads
(shop_r1/stages.py). A finished stage with the same key is skipped (said so), the unfinished one continues from its
own checkpoints (SFT and GRPO), and a stage whose config or inputs changed runs again, with everything below it.
config.yaml stays the run's first config; later changes are recorded in config_history.jsonl (shop_r1/run_config.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from shop_r1.config import Config, ConfigError, config_to_dict
from shop_r1.config import validate as check_config
from shop_r1.run_config import HARMLESS, check_resume, flatten, start_run_config
from shop_r1.stages import Ledger, file_fingerprint, stage_key
from shop_r1.storage import mirror_or_warn, mirror_run


def default_model_dir() -> Path:
    """Where the embedded default model is imported once and reused (override with SHOP_R1_CACHE)."""
    cache = Path(os.environ.get("SHOP_R1_CACHE", Path.home() / ".cache" / "shop_r1"))
    return cache / "models" / "smollm2-135m-instruct"


@contextmanager
def _stage(name: str, cfg: Config) -> Iterator[None]:
    print(f"==> {name} ...", flush=True)
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    print(f"<== {name} done in {seconds:.1f}s", flush=True)
    times_path = Path(cfg.run_dir) / "stage_seconds.json"  # the report's time per stage
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    times[name] = round(seconds, 1)
    times_path.write_text(json.dumps(times, indent=2))
    mirror_or_warn(cfg.run_dir, cfg.storage_uri)


# The stages `until` may name (`shop-r1 pipeline --until NAME`), in the order they run.
UNTIL_STAGES = {"examples": "examples", "sft": "SFT", "sft-eval": "SFT eval", "grpo": "GRPO (Shop-R1)"}


@dataclass(frozen=True)
class PipelineResult:
    """What a pipeline run made. A run stopped early by `until` has `stopped_after` set, and None for what it did not
    make (the GRPO model; the table, which needs every evaluation)."""
    run_dir: str
    model_dir: str
    sft_model_dir: str | None
    shop_r1_model_dir: str | None
    table: str | None
    stopped_after: str | None = None


def prepare_model(cfg: Config, run: Path | None = None) -> Path:
    """The policy's starting point: `model.path`, a from-scratch shop model built into the run folder (once; a
    finished build is reused), or the embedded SmolLM2 default."""
    from shop_r1.models.smollm2 import import_smollm2

    if cfg.model.path:  # a folder, or a Hugging Face id downloaded once into the run folder (the driver only)
        from shop_r1.models.hub import resolve_model_path

        return Path(resolve_model_path(cfg.model.path, run if run is not None else cfg.run_dir))
    if cfg.model.from_scratch:
        from shop_r1.models.tiny import build_tiny_model, default_corpus

        out = Path(run if run is not None else cfg.run_dir) / "model" / "shop_lm"
        if not (out / "shop_r1_model.json").exists():
            # The tokenizer learns from synthetic sessions of another seed: the same shop, none of the run's data.
            corpus = default_corpus(num_sessions=300, seed=cfg.data.synth_seed + 7919, version=cfg.data.synth_version)
            build_tiny_model(out, corpus, seed=cfg.seed,
                             vocab_size=cfg.model.scratch_vocab_size, hidden_size=cfg.model.scratch_hidden_size,
                             num_layers=cfg.model.scratch_num_layers, merges=cfg.model.scratch_tokenizer)
        return out
    return import_smollm2(default_model_dir())


def _model_input(path: str) -> dict[str, str]:
    """The model stage's outside input: a folder's bytes, or a hub id itself (its files arrive at the stage)."""
    from shop_r1.models.hub import is_hub_id

    if not path:
        return {}
    return {"model.path": f"hub:{path}" if is_hub_id(path) else file_fingerprint(path)}


def prepare_sessions(cfg: Config, run: Path) -> Path:
    from shop_r1.data.sessions import write_sessions
    from shop_r1.data.stats import session_stats
    from shop_r1.data.synth import synthesize_sessions

    if cfg.data.sessions_path:
        print(f"  using {cfg.data.sessions_path}")
        return Path(cfg.data.sessions_path)
    sessions = synthesize_sessions(cfg.data.synth_num_sessions, cfg.data.synth_seed, cfg.data.synth_version,
                                   cfg.data.synth_noise)
    path = run / "data" / "sessions.jsonl"
    write_sessions(sessions, path)
    print(session_stats(sessions).render(f"  synthesized -> {path}"))
    return path


def _rl_prompts(cfg: Config, model_dir: str, rl_examples_path: str) -> list:
    from shop_r1.data.encode import encode_prompts
    from shop_r1.data.examples import load_rl_examples
    from shop_r1.models.tokenizer import load_tokenizer
    from shop_r1.rollout.engine import max_model_len

    return encode_prompts(load_tokenizer(model_dir), load_rl_examples(rl_examples_path),
                          max_model_len(cfg, model_dir) - cfg.rollout.max_new_tokens)


@dataclass(frozen=True)
class StageData:
    """What the later stages read of the examples stage (recorded in the ledger, so a skipped stage gives it too)."""

    sft_train_path: str
    rl_train_path: str
    rl_test_path: str
    rl_val_path: str
    num_rl_val: int
    summary: str


# The config each stage's output depends on (dotted prefixes), less the keys that only set resources, timeouts,
# logging and checkpoint cadence (shop_r1/run_config.py: HARMLESS); eval.* counts for the evaluation stages.
STAGE_CONFIG: dict[str, tuple[str, ...]] = {
    "model": ("model.", "seed", "data.synth_seed", "data.synth_version"),
    "sessions": ("data.sessions_path", "data.synth_"),
    "examples": ("data.", "seed"),
    "eval": ("eval.", "rollout.", "reward.", "seed"),
    "SFT": ("sft.", "learner.", "seed"),
    "GRPO": ("rl.", "rollout.", "reward.", "learner.", "seed"),
}


def _config_slice(cfg: Config, stage: str) -> dict:
    harmless = [h for h in HARMLESS if not (stage == "eval" and h == "eval.") and not (stage == "GRPO" and
                                                                                        h == "rl.steps")]
    return {k: v for k, v in flatten(config_to_dict(cfg)).items()
            if any(k == p or (p.endswith((".", "_")) and k.startswith(p)) for p in STAGE_CONFIG[stage])
            and not any(k == h or (h.endswith(".") and k.startswith(h)) for h in harmless)}


def _val_prompts(cfg: Config, model_dir: str, built: StageData) -> list | None:
    """The fixed validation subset that GRPO scores every `rl.val_every` steps: `rl.val_examples` validation
    examples drawn with the run's seed (spread over sessions, not the first sessions of the file)."""
    import random

    if not cfg.rl.val_every:
        return None
    if not built.rl_val_path:
        raise ConfigError("rl.val_every > 0 needs a validation split: set data.val_fraction > 0")
    prompts = _rl_prompts(cfg, model_dir, built.rl_val_path)
    return random.Random(cfg.seed).sample(prompts, min(cfg.rl.val_examples, len(prompts)))


def _pad_id(model_dir: str) -> int:
    from shop_r1.models.tokenizer import load_tokenizer

    return load_tokenizer(model_dir).pad_token_id or 0


def run_pipeline(cfg: Config, until: str | None = None) -> PipelineResult:
    """data -> zero-shot eval -> SFT -> eval -> GRPO -> eval -> the table. `until` (a key of UNTIL_STAGES) stops after
    that stage; the same call without it later continues from there (the ledger skips what is done)."""
    from shop_r1.comparison import format_comparison
    from shop_r1.distributed.runtime import start_ray
    from shop_r1.evaluate import comparison_rows, evaluate, headroom_table, load_report
    from shop_r1.report import make_report
    from shop_r1.rollout.engine import max_model_len
    from shop_r1.sft import run_sft
    from shop_r1.train import run_grpo

    # Every rule the config, the stage and the sessions source decide, before the run folder, the model or Ray (a
    # config meant for real data stops here); the model's context is checked once the model is there.
    if until is not None and until not in UNTIL_STAGES:
        raise ConfigError(f"--until {until!r}: not a stage; one of {', '.join(UNTIL_STAGES)}")
    check_config(cfg, "pipeline")
    run = Path(cfg.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    if (run / "config.yaml").exists():  # a re-run: changed stages run again (their keys say so); record the changes
        check_resume(run, cfg, allow_change=True)
    else:
        start_run_config(run, cfg)
    print(f"run folder: {run.resolve()}", flush=True)
    ledger = Ledger.open(run)

    with _stage("model", cfg):
        k_model = stage_key("model", _config_slice(cfg, "model"), inputs=_model_input(cfg.model.path))
        model_dir = Path(ledger.run("model", k_model, lambda resume: {"dir": str(prepare_model(cfg, run))})["dir"])
        print(f"  policy model: {model_dir}")
        # Prompt + answer must fit the model's context: said here, before any stage tokenizes or trains.
        check_config(cfg, "pipeline", max_model_len=max_model_len(cfg, str(model_dir)))
    with _stage("sessions", cfg):
        sessions_input = {"data.sessions_path": file_fingerprint(cfg.data.sessions_path)} \
            if cfg.data.sessions_path else {}
        k_sessions = stage_key("sessions", _config_slice(cfg, "sessions"), inputs=sessions_input)
        sessions_path = ledger.run("sessions", k_sessions,
                                   lambda resume: {"path": str(prepare_sessions(cfg, run))})["path"]
    with _stage("examples", cfg):
        k_examples = stage_key("examples", _config_slice(cfg, "examples"), [k_model, k_sessions])
        built = StageData(**ledger.run("examples", k_examples, lambda resume: _build_examples(cfg, sessions_path,
                                                                                              run, model_dir)))
        print(built.summary)
    if until == "examples":
        return _stopped(run, model_dir, None, "examples")

    eval_path = built.rl_test_path
    if cfg.eval.split == "val":
        if not built.rl_val_path:
            raise ConfigError("eval.split=val needs a validation split: set data.val_fraction > 0")
        eval_path = built.rl_val_path
        print(f"  evaluating on the validation split ({built.num_rl_val} examples), not the test split")
    if not cfg.data.sessions_path and cfg.data.synth_version >= 2 and cfg.data.persona:
        from shop_r1.data.examples import load_rl_examples
        from shop_r1.data.synth.policy import oracle_exact

        ceiling = oracle_exact(load_rl_examples(eval_path))
        print(f"  ceiling: the shopper policy read off the prompt is {100 * ceiling:.2f}% exact on these examples "
              f"(data.synth_noise={cfg.data.synth_noise:g})", flush=True)
    print("starting Ray" + (" (local mode: everything in this process)" if cfg.ray.local_mode else
                            f" ({cfg.ray.address or 'a private cluster on this machine'})"), flush=True)
    runtime = start_ray(cfg.ray)
    local = runtime.local_mode
    reports = []
    k_eval = _config_slice(cfg, "eval")

    def evaluated(name: str, upstream: str, model: str, folder: str, label: str) -> None:
        key = stage_key(name, {**k_eval, "eval_path": eval_path}, [upstream])
        out = ledger.run(name, key, lambda resume: {"dir": str(
            Path(evaluate(cfg, model, eval_path, run / "eval" / folder, label, local).metrics_path).parent)})
        reports.append(load_report(out["dir"]))

    try:
        if cfg.eval.zero_shot:
            with _stage("zero-shot eval", cfg):
                evaluated("zero-shot eval", k_examples, str(model_dir), "zero_shot", "Zero-shot prompting")
        else:
            print("zero-shot eval: not run (eval.zero_shot=false)", flush=True)
        with _stage("SFT", cfg):
            k_sft = stage_key("SFT", _config_slice(cfg, "SFT"), [k_examples])
            sft = ledger.run("SFT", k_sft, lambda resume: _sft_outputs(run_sft(
                cfg, str(model_dir), built.sft_train_path, run / "sft", local, resume=resume)))
            print(f"  loss {sft['first_loss']:.4f} -> {sft['last_loss']:.4f} over {sft['num_steps']} steps")
        if until == "sft":
            return _stopped(run, model_dir, sft["hf_dir"], "sft")
        with _stage("SFT eval", cfg):
            evaluated("SFT eval", k_sft, sft["hf_dir"], "sft", "SFT")
        if until == "sft-eval":
            return _stopped(run, model_dir, sft["hf_dir"], "sft-eval")
        with _stage("GRPO (Shop-R1)", cfg):
            k_grpo = stage_key("GRPO", _config_slice(cfg, "GRPO"), [k_sft])
            grpo = ledger.run("GRPO", k_grpo, lambda resume: _grpo_outputs(run_grpo(
                cfg, sft["hf_dir"], _rl_prompts(cfg, sft["hf_dir"], built.rl_train_path), run / "grpo", local,
                resume=resume, pad_id=_pad_id(sft["hf_dir"]), val_prompts=_val_prompts(cfg, sft["hf_dir"], built))))
            print(f"  mean reward {grpo['first_reward']:.3f} -> {grpo['last_reward']:.3f} over {grpo['num_steps']} "
                  "steps")
        if until == "grpo":
            return _stopped(run, model_dir, sft["hf_dir"], "grpo")
        with _stage("Shop-R1 eval", cfg):
            evaluated("Shop-R1 eval", k_grpo, grpo["hf_dir"], "shop_r1", "Shop-R1")
    finally:
        runtime.shutdown()

    # The trivial baselines (always-terminate, majority type, the visible-rule table fitted on the training steps) on
    # the same examples, with kappa, session-resampled intervals and paired differences against SFT and the best one.
    comparison = comparison_rows(reports, baseline="SFT", train_examples_path=built.sft_train_path,
                                 test_examples_path=eval_path)
    table = format_comparison(comparison)
    headroom = headroom_table(reports)
    if headroom:
        table += "\n\n" + headroom
    (run / "results.md").write_text("```\n" + table + "\n```\n")
    (run / "results.json").write_text(json.dumps(
        {**{r.label: r.metrics.to_dict() for r in reports}, "comparison": comparison.to_dict(),
         "headroom": {r.label: r.headroom.to_dict() for r in reports if r.headroom is not None}}, indent=2))
    print("\n" + table, flush=True)
    report = make_report(run)
    print(f"report: {report.markdown_path}", flush=True)
    if cfg.storage_uri:
        mirrored = mirror_run(run, cfg.storage_uri)
        print(f"mirrored {mirrored.num_files} files to {mirrored.uri}", flush=True)
    return PipelineResult(run_dir=str(run), model_dir=str(model_dir), sft_model_dir=sft["hf_dir"],
                          shop_r1_model_dir=grpo["hf_dir"], table=table)


def _stopped(run: Path, model_dir: Path, sft_model_dir: str | None, until: str) -> PipelineResult:
    print(f"stopped after {UNTIL_STAGES[until]} (--until {until}); the same command without --until continues from "
          "here (finished stages are skipped)", flush=True)
    return PipelineResult(run_dir=str(run), model_dir=str(model_dir), sft_model_dir=sft_model_dir,
                          shop_r1_model_dir=None, table=None, stopped_after=until)


def _build_examples(cfg: Config, sessions_path: str, run: Path, model_dir: Path) -> dict:
    from shop_r1.data.build import build_datasets

    built = build_datasets(sessions_path, run / "data", model_dir, cfg.data, seed=cfg.seed)
    return {"sft_train_path": built.sft_train_path, "rl_train_path": built.rl_train_path,
            "rl_test_path": built.rl_test_path, "rl_val_path": built.rl_val_path, "num_rl_val": built.num_rl_val,
            "summary": built.render()}


def _sft_outputs(result) -> dict:
    return {"hf_dir": result.hf_dir, "num_steps": result.num_steps, "first_loss": result.first_loss,
            "last_loss": result.last_loss}


def _grpo_outputs(result) -> dict:
    return {"hf_dir": result.hf_dir, "num_steps": result.num_steps, "first_reward": result.first_reward,
            "last_reward": result.last_reward}

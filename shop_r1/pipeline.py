"""The main job, `shop-r1 pipeline`: the whole method on the configured setup, stage by stage.

    model -> sessions -> examples -> zero-shot eval -> SFT -> eval -> GRPO (Shop-R1) -> eval -> Table 2-style table

Every artefact lands in `run_dir`, starting with the resolved config. Ray is started (or attached to) once for all
stages; each stage builds its workers and gives them back when done, so the engines and the learner never hold
memory at the same time on a small machine.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from shop_r1.config import Config, save_config
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


@dataclass(frozen=True)
class PipelineResult:
    run_dir: str
    model_dir: str
    sft_model_dir: str
    shop_r1_model_dir: str
    table: str


def prepare_model(cfg: Config, run: Path | None = None) -> Path:
    """The policy's starting point: `model.path`, a from-scratch shop model built into the run folder (once; a
    finished build is reused), or the embedded SmolLM2 default."""
    from shop_r1.models.smollm2 import import_smollm2

    if cfg.model.path:
        return Path(cfg.model.path)
    if cfg.model.from_scratch:
        from shop_r1.models.tiny import build_tiny_model, default_corpus

        out = Path(run if run is not None else cfg.run_dir) / "model" / "shop_lm"
        if not (out / "shop_r1_model.json").exists():
            # The tokenizer learns from synthetic sessions of another seed: the same shop, none of the run's data.
            build_tiny_model(out, default_corpus(num_sessions=300, seed=cfg.data.synth_seed + 7919), seed=cfg.seed,
                             vocab_size=cfg.model.scratch_vocab_size, hidden_size=cfg.model.scratch_hidden_size,
                             num_layers=cfg.model.scratch_num_layers)
        return out
    return import_smollm2(default_model_dir())


def prepare_sessions(cfg: Config, run: Path) -> Path:
    from shop_r1.data.sessions import write_sessions
    from shop_r1.data.stats import session_stats
    from shop_r1.data.synth import synthesize_sessions

    if cfg.data.sessions_path:
        print(f"  using {cfg.data.sessions_path}")
        return Path(cfg.data.sessions_path)
    sessions = synthesize_sessions(cfg.data.synth_num_sessions, cfg.data.synth_seed)
    path = run / "data" / "sessions.jsonl"
    write_sessions(sessions, path)
    print(session_stats(sessions).render(f"  synthesized -> {path}"))
    return path


def _rl_prompts(cfg: Config, model_dir: str, rl_examples_path: str) -> list:
    from transformers import AutoTokenizer

    from shop_r1.data.encode import encode_prompts
    from shop_r1.data.examples import load_rl_examples
    from shop_r1.rollout.engine import max_model_len

    return encode_prompts(AutoTokenizer.from_pretrained(model_dir), load_rl_examples(rl_examples_path),
                          max_model_len(cfg, model_dir) - cfg.rollout.max_new_tokens)


def _pad_id(model_dir: str) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).pad_token_id or 0


def run_pipeline(cfg: Config) -> PipelineResult:
    from shop_r1.data.build import build_datasets
    from shop_r1.distributed.runtime import start_ray
    from shop_r1.evaluate import comparison_table, evaluate
    from shop_r1.report import make_report
    from shop_r1.sft import run_sft
    from shop_r1.train import run_grpo

    run = Path(cfg.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run / "config.yaml")
    print(f"run folder: {run.resolve()}", flush=True)

    with _stage("model", cfg):
        model_dir = prepare_model(cfg, run)
        print(f"  policy model: {model_dir}")
    with _stage("sessions", cfg):
        sessions_path = prepare_sessions(cfg, run)
    with _stage("examples", cfg):
        built = build_datasets(sessions_path, run / "data", model_dir, cfg.data, seed=cfg.seed)
        print(built.render())

    print("starting Ray" + (" (local mode: everything in this process)" if cfg.ray.local_mode else
                            f" ({cfg.ray.address or 'a private cluster on this machine'})"), flush=True)
    runtime = start_ray(cfg.ray)
    local = runtime.local_mode
    reports = []
    try:
        with _stage("zero-shot eval", cfg):
            reports.append(evaluate(cfg, str(model_dir), built.rl_test_path, run / "eval" / "zero_shot",
                                    "Zero-shot prompting", local))
        with _stage("SFT", cfg):
            sft = run_sft(cfg, str(model_dir), built.sft_train_path, run / "sft", local)
            print(f"  loss {sft.first_loss:.4f} -> {sft.last_loss:.4f} over {sft.num_steps} steps")
        with _stage("SFT eval", cfg):
            reports.append(evaluate(cfg, sft.hf_dir, built.rl_test_path, run / "eval" / "sft", "SFT", local))
        with _stage("GRPO (Shop-R1)", cfg):
            grpo = run_grpo(cfg, sft.hf_dir, _rl_prompts(cfg, sft.hf_dir, built.rl_train_path), run / "grpo", local,
                            pad_id=_pad_id(sft.hf_dir))
            print(f"  mean reward {grpo.first_reward:.3f} -> {grpo.last_reward:.3f} over {grpo.num_steps} steps")
        with _stage("Shop-R1 eval", cfg):
            reports.append(evaluate(cfg, grpo.hf_dir, built.rl_test_path, run / "eval" / "shop_r1", "Shop-R1", local))
    finally:
        runtime.shutdown()

    table = comparison_table(reports)
    (run / "results.md").write_text("```\n" + table + "\n```\n")
    (run / "results.json").write_text(json.dumps({r.label: r.metrics.to_dict() for r in reports}, indent=2))
    print("\n" + table, flush=True)
    report = make_report(run)
    print(f"report: {report.markdown_path}", flush=True)
    if cfg.storage_uri:
        mirrored = mirror_run(run, cfg.storage_uri)
        print(f"mirrored {mirrored.num_files} files to {mirrored.uri}", flush=True)
    return PipelineResult(run_dir=str(run), model_dir=str(model_dir), sft_model_dir=sft.hf_dir,
                          shop_r1_model_dir=grpo.hf_dir, table=table)

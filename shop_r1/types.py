"""Typed records passed between pipeline stages.

Every stage takes records and returns records; nothing downstream reads a loose dict. Field names follow the
paper (Table 1, Eq. 1): an `Action` has a `type` and, depending on it, a `name` and a `text`; a `Step` pairs the
page `observation` with the `action` and its optional `rationale`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

ActionType = Literal["click", "type_and_submit", "terminate"]
ACTION_TYPES: tuple[str, ...] = get_args(ActionType)


@dataclass(frozen=True)
class Action:
    """One user action. `name` is empty for terminate; `text` is only meaningful for type_and_submit."""

    type: ActionType
    name: str = ""
    text: str = ""

    def to_dict(self) -> dict[str, str]:
        """The JSON form of Appendix B: only the fields the action type has."""
        if self.type == "click":
            return {"type": "click", "name": self.name}
        if self.type == "type_and_submit":
            return {"type": "type_and_submit", "name": self.name, "text": self.text}
        return {"type": "terminate"}

    @staticmethod
    def from_dict(d: Any, where: str = "action") -> Action:
        """Validate and build; raises ValueError naming `where` and the offending field."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
        kind = d.get("type")
        if kind not in ACTION_TYPES:
            raise ValueError(f"{where}.type: expected one of {ACTION_TYPES}, got {kind!r}")
        required = {"click": ("name",), "type_and_submit": ("name", "text"), "terminate": ()}[kind]
        for key in required:
            if not isinstance(d.get(key), str):
                raise ValueError(f"{where}.{key}: a {kind} action needs a string {key!r}")
        return Action(type=kind, name=d.get("name", "") if kind != "terminate" else "",
                      text=d.get("text", "") if kind == "type_and_submit" else "")


@dataclass(frozen=True)
class Step:
    """One step of a session: the page the user saw, what they did on it, and (optionally) why."""

    observation: str
    action: Action
    rationale: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"observation": self.observation, "action": self.action.to_dict()}
        if self.rationale is not None:
            out["rationale"] = self.rationale
        return out


@dataclass(frozen=True)
class Session:
    """A whole shopping session: ordered steps, the first on the home page. `persona` is what is known of the shopper
    (the synthetic shop's profile, or OPeRA's persona text): with `data.persona` it heads every prompt of the
    session."""

    session_id: str
    steps: tuple[Step, ...]
    persona: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"session_id": self.session_id, "steps": [s.to_dict() for s in self.steps]}
        if self.persona is not None:
            out["persona"] = self.persona
        return out


@dataclass(frozen=True)
class Message:
    """One chat turn, as chat templates expect it."""

    role: Literal["system", "user", "assistant"]
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class SFTExample:
    """A whole session as one conversation; loss goes on the assistant turns (rationale + action JSON)."""

    session_id: str
    messages: tuple[Message, ...]
    train_last_turn_only: bool = False
    """Loss on the last assistant turn only (one prediction step with its context, data.sft_format=step); the
    earlier assistant turns are context, as in an RL prompt."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"session_id": self.session_id, "messages": [m.to_dict() for m in self.messages]}
        if self.train_last_turn_only:
            out["train_last_turn_only"] = True
        return out


@dataclass(frozen=True)
class RLExample:
    """One prediction step: the context up to and including the current page, and the next action.

    `prompt` ends with the user turn holding the current page; `target` is the action the real user took.
    `num_dropped_pages` counts earlier pages whose HTML was removed to fit `max_prompt_tokens`.
    """

    example_id: str
    session_id: str
    step_index: int
    prompt: tuple[Message, ...]
    target: Action
    target_rationale: str | None = None
    num_dropped_pages: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "example_id": self.example_id, "session_id": self.session_id, "step_index": self.step_index,
            "prompt": [m.to_dict() for m in self.prompt], "target": self.target.to_dict(),
            "target_rationale": self.target_rationale, "num_dropped_pages": self.num_dropped_pages,
        }


@dataclass(frozen=True)
class TokenLogprobs:
    """Per-token log-probabilities of one sampled response, as a rollout engine returns them.

    token_offsets[j] is the character offset in the response text where token j starts (token j ends where
    token j+1 starts; the last ends at len(text)). topk_logprobs[j] holds the logprobs of *distinct* vocabulary
    entries at position j (the top-k, the sampled token merged in without duplicates).
    """

    token_offsets: tuple[int, ...]
    topk_logprobs: tuple[tuple[float, ...], ...]
    vocab_size: int


@dataclass(frozen=True)
class TermValue:
    """One plug-in reward function's value for one response (shop_r1/reward/functions.py)."""

    name: str
    value: float | None  # None: the function does not apply to this response
    weight: float

    @property
    def weighted(self) -> float:
        return 0.0 if self.value is None else self.weight * self.value


@dataclass(frozen=True)
class RewardBreakdown:
    """Every term of the hybrid reward (Table 1 + Eq. 4), and their weighted total.

    `self_certainty` is the raw s(r); `total` = format + action_type + attribute + value + alpha * self_certainty.
    `format_valid` says whether the response parsed; `error` names a scorer failure (the documented fallback: all 0).
    `parsed` is what the reward stage parsed (None: the response does not parse, or its scoring failed): the batch
    builder (rationale tokens) and the rollout metrics (action mix) read it instead of parsing the text again.
    """

    format: float = 0.0
    action_type: float = 0.0
    attribute: float = 0.0
    value: float = 0.0
    self_certainty: float = 0.0
    total: float = 0.0
    format_valid: bool = False
    error: str | None = None
    parsed: ParsedResponse | None = field(default=None, compare=False, repr=False)
    terms: tuple[TermValue, ...] = ()
    """The plug-in reward functions' values, in order; their weighted sum (`plugin_total`) is in `total`
    (shop_r1/reward/functions.py). Empty with the default terms alone."""

    @property
    def plugin_total(self) -> float:
        """The plug-in functions' part of `total`: sum of weight * value over those that apply."""
        return sum((t.weighted for t in self.terms), 0.0)

    def to_dict(self) -> dict[str, float | None]:
        """Every term by name, the plug-in functions' too (None where one does not apply)."""
        return {"format": self.format, "action_type": self.action_type, "attribute": self.attribute,
                "value": self.value, "self_certainty": self.self_certainty, "total": self.total,
                **{t.name: t.value for t in self.terms}}


@dataclass(frozen=True)
class ParsedResponse:
    """A format-valid model response: its rationale, its action and where the rationale's characters lie.

    rationale_span = (start, end) character offsets in the original response text of the rationale string's
    JSON literal *content* (between the quotes), used to find the rationale's tokens.
    """

    rationale: str
    action: Action
    rationale_span: tuple[int, int] = field(default=(0, 0))


# ---------------------------------------------------------------------------------------------- rollout records
# Shape letters: P prompts, G samples per prompt (group size), B = P * G, T tokens.


@dataclass(frozen=True)
class SamplingSpec:
    """How an engine samples: `n` completions per prompt; temperature 0 means greedy."""

    n: int = 1
    temperature: float = 0.6
    max_new_tokens: int = 256
    top_k_logprobs: int = 20
    """Logprobs of the k most likely tokens at every position (0: only the sampled token's)."""
    seed: int | None = None


def step_sampling_seed(run_seed: int, step: int, n: int) -> int:
    """The sampling seed of GRPO step `step`'s requests. vLLM gives a request's i-th of n samples the seed `seed + i`
    (v1/engine/parallel_sampling.py), so consecutive steps seeded `base + step` shared n - 1 of their n random streams:
    with a slowly moving policy a prompt redrew nearly the same samples for n steps running, and explored one new
    stream a step, not n. Strided by n, no two steps of a run (nor two run seeds below 2**31, for 2**32 // n steps)
    share one. Any int run seed (a negative one is taken modulo 2**31); the result is below 2**63."""
    if step < 0 or n < 1:
        raise ValueError(f"step_sampling_seed needs step >= 0 and n >= 1 (got {step}, {n})")
    return (run_seed % 2**31) * 2**32 + step * n


@dataclass(frozen=True)
class Completion:
    """One sampled response and the engine's view of it, token by token.

    logprobs[j] is the logprob of the sampled token j under the distribution it was sampled from (softmax of the
    logits / temperature; temperature 1 for greedy) of the weights that produced it (`policy_version`);
    topk_logprobs[j] holds distinct tokens' logprobs of that distribution (the top-k plus the sampled token when it
    is not among them); token_offsets[j] is where token j's text starts in `text`.
    """

    token_ids: tuple[int, ...]  # [T]
    text: str
    logprobs: tuple[float, ...]  # [T]
    topk_logprobs: tuple[tuple[float, ...], ...]  # [T][<=k+1]
    token_offsets: tuple[int, ...]  # [T]
    finish_reason: str
    policy_version: int

    def token_logprobs(self, vocab_size: int) -> TokenLogprobs:
        return TokenLogprobs(self.token_offsets, self.topk_logprobs, vocab_size)


@dataclass(frozen=True)
class Generation:
    """The G completions of one prompt, in the order of the request's prompts (`prompt_index`)."""

    prompt_index: int
    prompt_token_ids: tuple[int, ...]
    completions: tuple[Completion, ...]  # [G]
    vocab_size: int


@dataclass(frozen=True)
class Prompt:
    """A chat-templated prompt ready for the engines: its token ids and the action the real user took next."""

    example_id: str
    token_ids: tuple[int, ...]  # [T_prompt]
    target: Action
    page_names: tuple[str, ...] | None = None
    """Element names (`name` attributes) of the page the action is taken on, for reward.click_guard
    (shop_r1/data/pages.py: page_element_names); None: not extracted."""


@dataclass(frozen=True)
class ScoreRequest:
    """What a reward worker needs for one response: its text, the target, and (optionally) its token logprobs."""

    response: str
    target: Action
    logprobs: TokenLogprobs | None = None
    page_names: tuple[str, ...] | None = None
    """The prompt's `page_names` (reward.click_guard); None: not known."""
    prompt: Prompt | None = None
    """The prompt it answers, for the plug-in reward functions (their `prompts`, `example_id`); None: not known."""


@dataclass(frozen=True)
class ScoredGeneration:
    """One prompt's G completions with their rewards, aligned: rewards[g] scores generation.completions[g]."""

    prompt: Prompt
    generation: Generation
    rewards: tuple[RewardBreakdown, ...]  # [G]


@dataclass(frozen=True)
class GRPOStepStats:
    """One GRPO update, every figure over the *global* batch (all ranks; token-weighted where per token)."""

    loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    grad_norm: float
    num_tokens: int
    step: int
    sampler_logprob_abs_diff_mean: float = 0.0
    """Mean |engine logprob - learner logprob| of the sampled tokens, both at the sampling temperature, the learner's
    before this update: 0 up to numerics when the engines run the learner's policy (synchronous); with one-step-off
    async (lag 1) it also holds the policy's drift over one update."""
    sampler_logprob_abs_diff_max: float = 0.0
    is_weight_mean: float = 1.0
    """With rl.async_level=1: mean truncated importance weight on the surrogate (1 when synchronous)."""
    is_truncated_fraction: float = 0.0
    """Share of tokens whose importance weight hit rl.async_is_cap."""
    nonfinite: str = ""
    """Why the update was skipped ("loss" / "grad_norm": NaN or inf, shop_r1/algo/finite.py), "" when it ran."""


@dataclass(frozen=True)
class SFTStepStats:
    loss: float
    """This rank's share of the global token-mean loss (sum over ranks = the global batch's loss)."""
    num_tokens: int
    grad_norm: float
    lr: float
    step: int
    nonfinite: str = ""
    """Why the optimizer step was skipped ("loss" / "grad_norm"), "" when it ran."""

"""Dataset statistics: what a user checks before training (action-type mix as in Table A1, lengths)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from shop_r1.types import ACTION_TYPES, RLExample, Session


def _mix_line(counts: dict[str, int]) -> str:
    total = sum(counts.values()) or 1
    return "  ".join(f"{t} {counts.get(t, 0)} ({100.0 * counts.get(t, 0) / total:.1f}%)" for t in ACTION_TYPES)


@dataclass(frozen=True)
class SessionStats:
    num_sessions: int
    num_steps: int
    action_counts: dict[str, int]
    mean_steps: float
    max_steps: int
    mean_observation_chars: float
    rationale_coverage: float
    """Share of steps that carry a rationale (SFT needs them; Appendix D fills the rest)."""

    def render(self, title: str = "sessions") -> str:
        return (f"{title}\n"
                f"  sessions {self.num_sessions}, steps {self.num_steps} "
                f"(mean {self.mean_steps:.2f}, max {self.max_steps} per session)\n"
                f"  actions: {_mix_line(self.action_counts)}\n"
                f"  mean page size {self.mean_observation_chars:.0f} chars, "
                f"rationales on {100.0 * self.rationale_coverage:.1f}% of steps")


def session_stats(sessions: Sequence[Session]) -> SessionStats:
    steps = [s for sess in sessions for s in sess.steps]
    counts = Counter(s.action.type for s in steps)
    n = max(len(steps), 1)
    return SessionStats(
        num_sessions=len(sessions),
        num_steps=len(steps),
        action_counts={t: counts.get(t, 0) for t in ACTION_TYPES},
        mean_steps=len(steps) / max(len(sessions), 1),
        max_steps=max((len(s.steps) for s in sessions), default=0),
        mean_observation_chars=sum(len(s.observation) for s in steps) / n,
        rationale_coverage=sum(s.rationale is not None for s in steps) / n,
    )


@dataclass(frozen=True)
class RLExampleStats:
    num_examples: int
    action_counts: dict[str, int]
    mean_prompt_tokens: float
    max_prompt_tokens: int
    num_with_dropped_pages: int
    """Examples with at least one earlier page's HTML to the prompt budget."""

    def render(self, title: str = "RL examples") -> str:
        return (f"{title}: {self.num_examples}\n"
                f"  targets: {_mix_line(self.action_counts)}\n"
                f"  prompt tokens mean {self.mean_prompt_tokens:.0f}, max {self.max_prompt_tokens}; "
                f"{self.num_with_dropped_pages} with earlier pages dropped")


def rl_example_stats(examples: Sequence[RLExample], prompt_tokens: Sequence[int]) -> RLExampleStats:
    counts = Counter(e.target.type for e in examples)
    return RLExampleStats(
        num_examples=len(examples),
        action_counts={t: counts.get(t, 0) for t in ACTION_TYPES},
        mean_prompt_tokens=sum(prompt_tokens) / max(len(prompt_tokens), 1),
        max_prompt_tokens=max(prompt_tokens, default=0),
        num_with_dropped_pages=sum(e.num_dropped_pages > 0 for e in examples),
    )

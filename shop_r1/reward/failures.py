"""Reward failures: which responses got the documented fallback, why, and when there are too many to go on.

A response that could not be scored gets a `RewardBreakdown` of zeros with `error` set, for one of three causes:

    "timeout"            the response was not scored within reward_pool.timeout_s, alone on a ready worker
    "worker crashed: ..." the reward worker process died while scoring it, alone
    anything else        the scorer raised ("<ExceptionType>: <message>", set by shop_r1/reward/worker.py)

A few fallbacks are a nuisance; many of them silently turn the reward into zeros, so a step whose share of fallbacks
exceeds reward_pool.max_failed_fraction stops the run. `count_failures` walks a step's rewards once; its record serves
both the check (`RewardFailures.check`) and the metrics (`RewardFailures.metrics`). Pure Python: no Ray, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shop_r1.types import RewardBreakdown

TIMEOUT_ERROR = "timeout"
"""`error` of a response that timed out alone (set by shop_r1/distributed/reward_pool.py)."""
CRASH_PREFIX = "worker crashed: "
"""Start of `error` of a response whose worker died while scoring it alone (reward_pool.py)."""

CAUSES = ("timeout", "crash", "error")
MAX_FAILED_FRACTION_KEY = "reward_pool.max_failed_fraction"

_HINTS = {
    "timeout": "responses not scored within reward_pool.timeout_s (a hanging scorer, or a machine too loaded: "
               "raise reward_pool.timeout_s or give the reward workers more CPUs)",
    "crash": "the reward worker process died while scoring (out of memory? a native crash in the scorer?)",
    "error": "the scorer raised (a bug in the scorer or unexpected data)",
}


class RewardFailureError(RuntimeError):
    """Too many responses of one step got the fallback reward: training on them would train on zeros."""


def crash_error(exc: BaseException) -> str:
    """The `error` text for a response whose worker died while scoring it."""
    return f"{CRASH_PREFIX}{type(exc).__name__}"


def failure_cause(error: str | None) -> str | None:
    """The cause of a fallback from its `RewardBreakdown.error`: "timeout", "crash" or "error" (None: no failure)."""
    if error is None:
        return None
    if error == TIMEOUT_ERROR:
        return "timeout"
    if error.startswith(CRASH_PREFIX.rstrip(": ")):
        return "crash"
    return "error"


@dataclass(frozen=True)
class RewardFailures:
    """A step's fallback rewards, counted once (`count_failures`): the driver's check and its metrics both read it."""

    num_rewards: int
    counts: Mapping[str, int]
    """Fallbacks per cause, every cause of CAUSES present (0 when none)."""
    first_error: Mapping[str, str]
    """The first `error` text seen of each cause that occurred."""

    @property
    def num_failed(self) -> int:
        return sum(self.counts.values())

    @property
    def share(self) -> float:
        """num_failed / num_rewards (0.0 for no rewards)."""
        return self.num_failed / self.num_rewards if self.num_rewards else 0.0

    def metrics(self) -> dict[str, float]:
        """Metric keys `reward/num_failed` (all fallbacks) and `reward/num_failed_<cause>` for each cause."""
        out = {"reward/num_failed": float(self.num_failed)}
        out.update({f"reward/num_failed_{cause}": float(self.counts[cause]) for cause in CAUSES})
        return out

    def check(self, max_failed_fraction: float, where: str) -> float:
        """Raise `RewardFailureError` when the share of fallback rewards exceeds `max_failed_fraction`.

        The message names `where` (e.g. "step 12"), the share, the limit and its config key, and each cause with its
        count and its first error text. Returns the share. A limit of 1.0 never raises; one outside [0, 1] is a
        ValueError naming the key.
        """
        if not 0.0 <= max_failed_fraction <= 1.0:
            raise ValueError(f"{MAX_FAILED_FRACTION_KEY} must be in [0, 1], got {max_failed_fraction}")
        share = self.share
        if share > max_failed_fraction:
            causes = "; ".join(f"{cause}: {self.counts[cause]} (first error: {self.first_error[cause]!r}; "
                               f"{_HINTS[cause]})" for cause in CAUSES if self.counts[cause])
            raise RewardFailureError(
                f"{where}: {self.num_failed} of {self.num_rewards} rewards are fallbacks (share {share:.3g}), above "
                f"the limit {MAX_FAILED_FRACTION_KEY}={max_failed_fraction:g}. Causes: {causes}. Fix the cause, or "
                f"raise {MAX_FAILED_FRACTION_KEY} (1.0 turns the check off).")
        return share


def count_failures(rewards: Sequence[RewardBreakdown]) -> RewardFailures:
    """One walk over a step's rewards: the fallbacks per cause and the first error text of each."""
    counts = dict.fromkeys(CAUSES, 0)
    first: dict[str, str] = {}
    for r in rewards:
        cause = failure_cause(r.error)
        if cause is not None:
            counts[cause] += 1
            first.setdefault(cause, str(r.error))
    return RewardFailures(len(rewards), counts, first)


def failure_counts(rewards: Sequence[RewardBreakdown]) -> dict[str, float]:
    """`count_failures(rewards).metrics()`: for a caller that has no record at hand."""
    return count_failures(rewards).metrics()


def check_failed_fraction(rewards: Sequence[RewardBreakdown], max_failed_fraction: float, where: str) -> float:
    """`count_failures(rewards).check(max_failed_fraction, where)`: for a caller that has no record at hand."""
    return count_failures(rewards).check(max_failed_fraction, where)

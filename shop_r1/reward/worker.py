"""The reward worker: the pure scorer applied to a list of requests, one failure never taking down the rest.

A scorer that raises on a response gives that response the documented fallback: a `RewardBreakdown` of zeros with
`error` set (counted as `reward/num_failed` in the metrics). Hangs are handled one level up, by the pool, which can
kill and replace a worker (shop_r1/distributed/reward_pool.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from shop_r1.config import RewardConfig
from shop_r1.reward.format import parse_response
from shop_r1.reward.functions import RewardFunctionError, RewardTerm, call_term, import_callable, with_terms
from shop_r1.reward.scorer import score_response
from shop_r1.reward.self_certainty import check_reward_config
from shop_r1.types import Action, RewardBreakdown, ScoreRequest, TokenLogprobs

ScoreFn = Callable[[str, Action, RewardConfig, "TokenLogprobs | None"], RewardBreakdown]


def fallback_reward(error: str) -> RewardBreakdown:
    """The documented fallback for a response that could not be scored: 0 in every term, flagged."""
    return RewardBreakdown(error=error)


def with_parse(reward: RewardBreakdown, response: str, score_fn: ScoreFn) -> RewardBreakdown:
    """The breakdown with `parsed` filled: the Shop-R1 scorer fills it itself; a plug-in reward (`reward.fn`) that
    leaves it None gets the response parsed here, so that the reward stage stays the one place that parses."""
    if score_fn is score_response or reward.parsed is not None or reward.error is not None:
        return reward
    parsed = parse_response(response)
    return reward if parsed is None else dataclasses.replace(reward, parsed=parsed)


class RewardWorker:
    """Scores a chunk: the Shop-R1 terms (or `reward.fn`) per response, then each plug-in reward function
    (`terms`, shop_r1/reward/functions.py) once over the chunk, its weighted values added to the totals."""

    def __init__(self, cfg: RewardConfig, score_fn: ScoreFn = score_response,
                 terms: Sequence[RewardTerm] = ()) -> None:
        check_reward_config(cfg)
        self._cfg = cfg
        self._score_fn = score_fn
        self._terms = tuple(terms)

    def score(self, requests: Sequence[ScoreRequest]) -> list[RewardBreakdown]:
        out = []
        for req in requests:
            try:
                out.append(with_parse(self._score_one(req), req.response, self._score_fn))
            except Exception as e:  # noqa: BLE001 - one bad response must not kill the batch; it is flagged
                out.append(fallback_reward(f"{type(e).__name__}: {e}"))
        if not self._terms:
            return out
        values = [self._term_values(t, requests) for t in self._terms]
        scored = with_terms(out, [[v for v, _ in vs] for vs in values], self._terms)
        failed = [next((err for vs in values if (err := vs[i][1])), None) for i in range(len(requests))]
        # A function that raised on a response: that response gets the fallback, flagged with the function's name.
        return [r if err is None else fallback_reward(err) for r, err in zip(scored, failed)]

    @staticmethod
    def _term_values(term: RewardTerm, requests: Sequence[ScoreRequest]) -> list[tuple[float | None, str | None]]:
        """The function's value for each request, with the error of any it raised on: called once on the chunk,
        then, if it raised, once per response to find which (a broken contract, RewardFunctionError, is raised)."""
        try:
            return [(v, None) for v in call_term(term, requests)]
        except RewardFunctionError:
            raise
        except Exception:  # noqa: BLE001 - narrowed below, one response at a time
            pass
        out: list[tuple[float | None, str | None]] = []
        for req in requests:
            try:
                out.append((call_term(term, [req])[0], None))
            except RewardFunctionError:
                raise
            except Exception as e:  # noqa: BLE001 - one bad response must not kill the batch; it is flagged
                out.append((None, f"reward/{term.name}: {type(e).__name__}: {e}"))
        return out

    def _score_one(self, req: ScoreRequest) -> RewardBreakdown:
        """The Shop-R1 scorer also gets the page's element names (reward.click_guard); a plug-in reward keeps the
        documented four-argument call."""
        if self._score_fn is score_response:
            return score_response(req.response, req.target, self._cfg, req.logprobs, req.page_names)
        return self._score_fn(req.response, req.target, self._cfg, req.logprobs)

    def ping(self) -> bool:
        return True


def load_score_fn(spec: str) -> ScoreFn:
    """`reward.fn` ("package.module:function") -> the function; empty -> the Shop-R1 hybrid reward."""
    if not spec:
        return score_response
    from shop_r1.config import ConfigError
    from shop_r1.config.reward import fn_spec_problems

    malformed = fn_spec_problems(spec)  # its form is the config's rule (load_config refuses it too)
    if malformed:
        raise ConfigError(malformed[0])
    return import_callable(spec, f"reward.fn={spec!r}")

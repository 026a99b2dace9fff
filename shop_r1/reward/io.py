"""`shop-r1 reward score`: score a JSONL file of responses.

Input line: {"response": str, "target": {action}, "logprobs": {"token_offsets": [...], "topk_logprobs": [[...]],
"vocab_size": V}?, "page_names": [str]?} (page_names: the page's element names, needed with reward.click_guard).
Output line: the input object plus "reward": {format, action_type, attribute, value, self_certainty, total}.
A malformed input line stops the run with FILE:LINE and the problem (nothing is skipped).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shop_r1.atomic import open_atomic
from shop_r1.config import RewardConfig
from shop_r1.data.jsonl import read_jsonl_objects
from shop_r1.reward.scorer import score_response
from shop_r1.reward.self_certainty import check_reward_config
from shop_r1.types import Action, TokenLogprobs


def _logprobs_from(obj: Any, where: str) -> TokenLogprobs | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: logprobs: expected an object")
    try:
        offsets = tuple(int(x) for x in obj["token_offsets"])
        rows = tuple(tuple(float(v) for v in row) for row in obj["topk_logprobs"])
        vocab = int(obj["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: logprobs: needs token_offsets, topk_logprobs and vocab_size ({e})") from None
    if len(offsets) != len(rows):
        raise ValueError(f"{where}: logprobs: {len(offsets)} token_offsets but {len(rows)} topk_logprobs rows")
    if vocab < 2 or any(len(r) > vocab for r in rows):
        raise ValueError(f"{where}: logprobs: vocab_size {vocab} is too small for the rows given")
    return TokenLogprobs(offsets, rows, vocab)


def _page_names_from(obj: Any, where: str, cfg: RewardConfig) -> tuple[str, ...] | None:
    if obj is None:
        if cfg.click_guard:
            raise ValueError(f"{where}: page_names: reward.click_guard needs the page's element names "
                             "(a list of strings) on every line")
        return None
    if not isinstance(obj, list) or not all(isinstance(n, str) for n in obj):
        raise ValueError(f"{where}: page_names: expected a list of strings")
    return tuple(obj)


def score_jsonl(input_path: str | Path, output_path: str | Path, cfg: RewardConfig) -> int:
    """Score every line; the output is written aside and renamed, so a failed run leaves no half file."""
    check_reward_config(cfg)
    n = 0
    with open_atomic(output_path) as dst:
        for where, obj in read_jsonl_objects(input_path):
            if not isinstance(obj.get("response"), str):
                raise ValueError(f"{where}: response: expected a string field 'response'")
            target = Action.from_dict(obj.get("target"), where=f"{where}: target")
            reward = score_response(obj["response"], target, cfg, _logprobs_from(obj.get("logprobs"), where),
                                    _page_names_from(obj.get("page_names"), where, cfg))
            obj["reward"] = reward.to_dict()
            dst.write(json.dumps(obj, ensure_ascii=False) + "\n")
            n += 1
    return n

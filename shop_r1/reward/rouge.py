"""ROUGE-L (LCS F-measure) exactly as rouge-score's `rougeL` without stemming, without its per-call overhead.

rouge-score tokenizes by lowercasing, replacing every run of characters outside [a-z0-9] by a space and splitting;
F = 2PR / (P + R) with P = LCS / |pred|, R = LCS / |ref|; an empty side gives 0. We repeat those exact steps (same
regexes, same float operations) so the value is bit-identical; a test compares against rouge-score on many pairs.
This is the hot path of the reward workers, so the LCS is a single-row dynamic programme.
"""

from __future__ import annotations

import re

_NON_ALPHANUM_RE = re.compile(r"[^a-z0-9]+")
_SPACES_RE = re.compile(r"\s+")
_VALID_TOKEN_RE = re.compile(r"^[a-z0-9]+$")


def rouge_tokens(text: str) -> list[str]:
    """rouge-score's default tokenizer (no stemming)."""
    tokens = _SPACES_RE.split(_NON_ALPHANUM_RE.sub(" ", text.lower()))
    return [t for t in tokens if _VALID_TOKEN_RE.match(t)]


def lcs_length(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence, O(|a||b|) time, O(|b|) memory."""
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else (cur[j] if cur[j] > prev[j + 1] else prev[j + 1]))
        prev = cur
    return prev[-1]


def rouge_l(pred: str, ref: str) -> float:
    """ROUGE-L F-measure of `pred` against `ref`, in [0, 1]."""
    pred_tokens, ref_tokens = rouge_tokens(pred), rouge_tokens(ref)
    if not pred_tokens or not ref_tokens:
        return 0.0
    if pred_tokens == ref_tokens:
        return 1.0
    lcs = lcs_length(ref_tokens, pred_tokens)
    precision = lcs / len(pred_tokens)
    recall = lcs / len(ref_tokens)
    if precision + recall > 0:
        return 2 * precision * recall / (precision + recall)
    return 0.0

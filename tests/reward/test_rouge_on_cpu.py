"""Our ROUGE-L must equal rouge-score's rougeL F-measure (no stemming) on any input."""

import random

import pytest
from rouge_score import rouge_scorer

from shop_r1.reward.rouge import lcs_length, rouge_l

WORDS = ["shoe", "Shoes", "red", "RED", "trail", "running", "a", "b", "c", "42", "x1", "über", "café", "naïve",
         "search_results", "refinements.brand.nike", "view_product", "--", "!!", "$19.99", "4.5", "K", "İstanbul",
         "日本", "", " ", "\t", "a-b", "O'Neil", "e-commerce"]


def _random_text(rng: random.Random) -> str:
    n = rng.randint(0, 12)
    seps = [" ", "  ", ".", "_", "-", ", ", "\n", "/"]
    return "".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(n))


def test_matches_rouge_score_on_many_generated_pairs():
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    rng = random.Random(1234)
    for _ in range(3000):
        pred, ref = _random_text(rng), _random_text(rng)
        if rng.random() < 0.2:
            ref = pred  # identical pairs
        assert rouge_l(pred, ref) == scorer.score(ref, pred)["rougeL"].fmeasure, (pred, ref)


@pytest.mark.parametrize("pred, ref, expected", [
    ("", "anything", 0.0),
    ("anything", "", 0.0),
    ("!!!", "???", 0.0),                        # no valid tokens on either side
    ("a b c d", "a b c d", 1.0),
    ("A.B.C.D", "a b c d", 1.0),                # lowercased, punctuation splits
    ("a b c e", "a b c d", 0.75),               # LCS 3 / 4 both ways
    ("d c b a", "a b c d", 0.25),               # order matters: LCS 1
    ("waterproof hiking backpack cheap", "waterproof hiking backpack", 6 / 7),
])
def test_hand_values(pred, ref, expected):
    assert rouge_l(pred, ref) == pytest.approx(expected)


def test_lcs_is_symmetric_and_correct_on_a_classic_pair():
    a, b = list("ABCBDAB"), list("BDCABA")
    assert lcs_length(a, b) == lcs_length(b, a) == 4

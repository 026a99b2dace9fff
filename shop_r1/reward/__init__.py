"""The Shop-R1 hybrid reward: format, hierarchical action reward with DARS (Table 1), rationale self-certainty.

Pure Python (+ torch for the exact self-certainty): safe to import in reward actors, tests and notebooks.
"""

from shop_r1.reward.action import action_reward, exact_match
from shop_r1.reward.format import parse_response
from shop_r1.reward.rouge import rouge_l
from shop_r1.reward.scorer import score_response

__all__ = ["action_reward", "exact_match", "parse_response", "rouge_l", "score_response"]

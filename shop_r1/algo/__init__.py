"""The GRPO algorithm as pure torch: advantages, the clipped objective with KL, logprobs, batch building."""

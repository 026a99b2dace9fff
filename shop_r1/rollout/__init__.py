"""Rollout: the engine seam (`RolloutEngine`) and its vLLM backend, with the engine side of weight loading."""

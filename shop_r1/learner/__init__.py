"""The learner: DeepSpeed ranks that train the policy (SFT now; GRPO with a reference policy next)."""

"""The learner: the ranks that train the policy (SFT, and GRPO with a frozen reference). One actor, `rank.LearnerRank`,
over DeepSpeed ZeRO or torch FSDP2 (`learner.backend`, a `backend.TrainingBackend`); the steps are written once
against the rank (grpo_step.py, sft_step.py)."""

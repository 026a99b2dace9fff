"""The learner: the ranks that train the policy (SFT, and GRPO with a frozen reference), on DeepSpeed ZeRO or torch
FSDP2 (`learner.backend`); the steps are written once against the backend seam (backend.py)."""

"""Sessions (schema, synthetic shop, OPeRA), prompts and SFT/RL examples. Pure: no ray, vllm or deepspeed."""

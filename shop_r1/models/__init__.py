"""Models built in code (the tiny test model) or imported offline (SmolLM2-135M-Instruct from a PyPI package)."""

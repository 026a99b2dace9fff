"""shop-r1: train LLMs to simulate online shoppers with RL (the Shop-R1 method, ICLR 2026)."""

__version__ = "0.1.0"

"""hybridrl: RL post-training for LLMs, one controller, many SPMD workers."""

__version__ = "0.1.0"


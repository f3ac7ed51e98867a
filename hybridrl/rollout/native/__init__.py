"""The native rollout engine (paged KV cache, continuous batching, CUDA graphs); see docs/rollout.md."""

from hybridrl.rollout.native.engine import NativeRolloutEngine

__all__ = ["NativeRolloutEngine"]

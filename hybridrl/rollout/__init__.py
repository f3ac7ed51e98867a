"""Generation engines behind one interface (`RolloutEngine`)."""

from hybridrl.rollout.base import RolloutEngine, SamplingParams


def make_rollout_engine(name: str, model, tokenizer, *, max_num_seqs: int, autocast_dtype=None) -> RolloutEngine:
    if name == "hf":
        from hybridrl.rollout.hf import HFRolloutEngine

        return HFRolloutEngine(model, tokenizer, max_num_seqs=max_num_seqs, autocast_dtype=autocast_dtype)
    if name in ("native", "vllm"):
        raise NotImplementedError(
            f"actor_rollout_ref.rollout.name={name!r} is not available in this version; use rollout.name=hf"
        )
    raise ValueError(f"unknown actor_rollout_ref.rollout.name={name!r}; choose one of hf, native, vllm")


__all__ = ["RolloutEngine", "SamplingParams", "make_rollout_engine"]

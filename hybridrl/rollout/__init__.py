"""Generation engines behind one interface (`RolloutEngine`)."""

import sys

import torch

from hybridrl.rollout.base import RolloutEngine, SamplingParams


def make_rollout_engine(
    name: str,
    model,
    tokenizer,
    *,
    max_num_seqs: int,
    autocast_dtype=None,
    rollout=None,
    max_model_len: int = 2048,
    named_weights=None,
    tp_group=None,
) -> RolloutEngine:
    """The engine `actor_rollout_ref.rollout.name` asks for, over the trainer's `model`.

    `rollout` is the RolloutConfig (the native and vllm engines read their keys from it);
    `max_model_len` bounds prompt + response tokens (data.max_prompt_length + max_response_length).
    `auto` is native on a GPU and hf on CPU, where `generate` is the reference and as fast.
    `named_weights`: (HF name, tensor) pairs an engine with its own weights starts from, instead of
    `model`'s parameters (LoRA: the merged policy); such an engine never aliases `model`.
    `tp_group`: this rank's tensor-parallel process group of the rollout (None: no TP); only the
    native engine shards, and then it keeps its slice of the full tensors it is given.
    """
    tp_size = torch.distributed.get_world_size(tp_group) if tp_group is not None else 1
    if name == "auto":
        name = "native" if next(model.parameters()).device.type == "cuda" else "hf"
    if name == "native":
        from hybridrl.models.llama import unsupported_reason

        reason = unsupported_reason(model.config)
        if reason is None:
            from hybridrl.rollout.native import NativeRolloutEngine
            from hybridrl.rollout.native.tp import TensorParallel

            device = next(model.parameters()).device
            return NativeRolloutEngine.from_hf_model(
                model,
                tokenizer,
                device=device,
                named_weights=named_weights,
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=rollout.max_num_batched_tokens,
                gpu_memory_utilization=rollout.gpu_memory_utilization,
                enforce_eager=rollout.enforce_eager,
                decode_steps_per_sync=rollout.decode_steps_per_sync,
                prefix_caching=rollout.enable_prefix_caching,
                chunked_prefill=rollout.enable_chunked_prefill,
                tp=TensorParallel.of(tp_group) if tp_size > 1 else None,
            )
        if tp_size > 1:
            raise ValueError(
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp_size} needs the native engine, which does "
                f"not support this model ({reason}); use tensor_model_parallel_size=1"
            )
        print(f"hybridrl: rollout.name=native does not support this model ({reason}); using rollout.name=hf", file=sys.stderr)
        name = "hf"
    if tp_size > 1:
        raise ValueError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp_size} needs rollout.name=native "
            f"(got {name}; auto is hf on CPU); set actor_rollout_ref.rollout.name=native or tensor_model_parallel_size=1"
        )
    if name == "hf":
        from hybridrl.rollout.hf import HFRolloutEngine

        return HFRolloutEngine(model, tokenizer, max_num_seqs=max_num_seqs, autocast_dtype=autocast_dtype)
    if name == "vllm":
        from hybridrl.rollout.vllm import VLLMRolloutEngine

        return VLLMRolloutEngine.from_hf_model(model, tokenizer, rollout=rollout, max_model_len=max_model_len)
    raise ValueError(f"unknown actor_rollout_ref.rollout.name={name!r}; choose one of auto, native, hf, vllm")


__all__ = ["RolloutEngine", "SamplingParams", "make_rollout_engine"]

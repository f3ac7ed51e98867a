"""The native rollout engine: paged KV cache, continuous batching, CUDA-graph decode.

One `generate` call:
1. every prompt (left padding stripped) becomes a group of `n` samples waiting for admission;
2. each iteration admits the groups that fit (rows, KV blocks, prefill token budget), prefills
   them right-padded in one forward pass (their K/V go straight into the paged cache), samples
   each sample's first token, and forks the samples onto the prompt's shared blocks;
3. one decode step then runs every running sequence: a single token each, attending over its
   blocks; finished sequences leave and the remaining rows are compacted, so the batch is never
   re-padded and waiting prompts join as soon as blocks free up.

The parts: the scheduler (scheduler.py) owns the queues and the blocks; the model runner
(runner.py) owns the model, the cache, the device row buffers and the forward passes (CUDA
graphs); the run record (record.py) holds every output row on the host; the turns (turns.py)
pause and resume multi-turn sequences. `Generation` (generation.py) is one call's loop between
them, a step being schedule -> run -> postprocess; the optional modes come in as `Hooks`
(rollout/base.py).

Tensor parallelism (`tp`, see tp.py): each rank of a replica runs this same loop on the same
prompts with the same seeds (drawn on the replica's first rank and broadcast); the runner's
collectives keep the ranks' tokens identical, so their schedules never diverge.
"""

from __future__ import annotations

from typing import Iterable
from typing import Sequence as Seq

import torch

from hybridrl.data.batch import Batch
from hybridrl.rollout.base import NO_HOOKS, Hooks, SamplingParams, vocab_limit
from hybridrl.rollout.base import eos_token_ids as default_eos_ids
from hybridrl.rollout.native.cache import KVCache
from hybridrl.rollout.native.generation import Generation
from hybridrl.rollout.native.runner import ModelRunner
from hybridrl.rollout.native.tp import TensorParallel
from hybridrl.rollout.native.weights import canonical_name

__all__ = ["BLOCK_SIZE", "Generation", "NativeRolloutEngine", "canonical_name"]

BLOCK_SIZE = 16
DECODE_STEPS_CUDA = 1  # decode steps per launch on CUDA: 8 measured no faster on an H200 host (BENCHMARKS.md)


RESUME_WAIT_STEPS = 16  # see NativeRolloutEngine(resume_wait_steps=)


class NativeRolloutEngine:
    def __init__(
        self,
        hf_config,
        tokenizer,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        max_model_len: int = 2048,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = False,
        block_size: int = BLOCK_SIZE,
        num_blocks: int | None = None,
        ignore_eos: bool = False,
        eos_token_ids: list[int] | None = None,
        tp: TensorParallel | None = None,
        decode_steps_per_sync: int | None = None,
        resume_wait_steps: int = RESUME_WAIT_STEPS,
        prefix_caching: bool = False,
        chunked_prefill: bool = False,
        record_routing: bool = False,
    ):
        """`tp`: this rank's tensor-parallel group (None or size 1: the whole model on this device).
        `decode_steps_per_sync`: decode steps launched together (one CUDA graph replay) before the
        host reads their tokens; None = DECODE_STEPS_CUDA on CUDA, 1 on CPU.
        `resume_wait_steps` (multi-turn): sequences whose tool or user turn has answered wait up to
        this many decode steps to rejoin the batch together (one extend pass over their appended
        tokens instead of one per answer); 0 = each rejoins as soon as its answer arrives.
        `prefix_caching`: prompts that start with the same full KV blocks as a prompt already in
        the cache (a shared system prompt) share those blocks and compute only the rest, within
        one generate call (scheduler.py); single-device engines only (ignored with `tp`).
        `chunked_prefill`: a prompt longer than `max_num_batched_tokens` is prefilled in chunks of
        that many tokens, one chunk between decode steps, so running sequences go on decoding
        (single-device engines only).
        `record_routing`: a mixture of experts records each token's experts in every sparse layer
        (ROUTED_EXPERTS, for router replay R3; routing.py)."""
        device = torch.device(device)
        self.tokenizer = tokenizer
        # from_hf_model passes the HF engine's set (config + generation config + tokenizer)
        self.eos_token_ids = eos_token_ids or default_eos_ids(hf_config, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs
        self.max_num_batched_tokens, self.block_size, self.ignore_eos = max_num_batched_tokens, block_size, ignore_eos
        self.runner = ModelRunner(
            hf_config,
            device=device,
            dtype=dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32),
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            block_size=block_size,
            num_blocks=num_blocks,
            tp=tp,
            decode_steps=decode_steps_per_sync
            if decode_steps_per_sync is not None
            else (DECODE_STEPS_CUDA if device.type == "cuda" else 1),
            vocab_limit=vocab_limit(tokenizer),
            record_routing=record_routing,
        )
        if (prefix_caching or chunked_prefill) and tp is not None and tp.size > 1:
            raise ValueError("prefix_caching and chunked_prefill run on single-device engines, not with tp")
        self.resume_wait_steps = resume_wait_steps
        self.prefix_caching = prefix_caching
        self.prefill_chunk = max_num_batched_tokens if chunked_prefill else None
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def from_hf_model(
        cls, model, tokenizer, *, share_weights: bool = True, named_weights=None, **kwargs
    ) -> "NativeRolloutEngine":
        """An engine with `model`'s weights: aliased (zero copy) when device and dtype are the same
        and `share_weights`, copied otherwise; or copied from `named_weights` when given (full
        tensors; a tensor-parallel engine keeps its slices)."""
        engine = cls(model.config, tokenizer, eos_token_ids=default_eos_ids(model, tokenizer), **kwargs)
        first = next(model.parameters())
        if named_weights is not None:
            engine.load_weights(named_weights)
        elif engine.tp is not None:
            engine.load_weights(model.named_parameters())
        elif share_weights and first.device == engine.device and first.dtype == engine.dtype:
            engine.runner.weights.alias_weights(model)
        else:
            engine.load_weights(model.named_parameters())
        return engine

    @classmethod
    def from_config(cls, model, tokenizer, args) -> "NativeRolloutEngine":
        """`build_rollout`'s constructor (`args`: a `rollout.factory.EngineArgs`)."""
        keys = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "enforce_eager", "decode_steps_per_sync")
        return cls.from_hf_model(
            model,
            tokenizer,
            device=next(model.parameters()).device,
            named_weights=args.named_weights,
            max_model_len=args.max_model_len,
            tp=TensorParallel.of(args.tp_group) if args.tp > 1 else None,
            record_routing=args.record_routing,
            **{k: getattr(args.rollout, k) for k in keys},
            **args.tp1_only,
        )

    # -- what callers read of the runner (RolloutEngine.model; tests and benchmarks the rest) -----
    @property
    def model(self) -> torch.nn.Module:
        """The module the engine generates with (the native decoder; its parameters may alias
        the trainer's)."""
        return self.runner.model

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.runner.dtype

    @property
    def tp(self) -> TensorParallel | None:
        """The tensor-parallel group (None at TP=1)."""
        return self.runner.tp

    @property
    def cache(self) -> KVCache | None:
        return self.runner.cache

    @property
    def use_graphs(self) -> bool:
        return self.runner.use_graphs

    # -- RolloutEngine -------------------------------------------------------------------------
    def alias_weights(self, model) -> None:
        """See `WeightLoader.alias_weights`: the engine then reads the trainer's tensors."""
        self.runner.weights.alias_weights(model)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], sharded: bool = False) -> None:
        """Copy weights in one tensor at a time (converting dtype/device on the way); tensors the
        engine already aliases are skipped. Names the engine does not have raise.

        `named_tensors`: (HF name, tensor) pairs, any subset of the model's parameters, in any order.
        With tensor parallelism, `sharded=False` (the default): full tensors, of which this rank
        keeps its slice; `sharded=True`: each tensor is already this rank's piece, i.e. equals
        `hybridrl.models.tp_shards.shard(name, full, hf_config, tp.rank, tp.size)` (the
        resharder's path: no rank ever holds a full tensor). At TP=1 both are the same."""
        self.runner.weights.load_weights(named_tensors, sharded=sharded)

    def wake(self) -> None:
        """Allocate the KV cache (CUDA graphs are kept when it lands at the same address)."""
        self.runner.wake()

    def sleep(self) -> None:
        """Free the KV cache (the trainer gets the memory); weights and row buffers stay."""
        self.runner.sleep()

    # -- generation ----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self, prompts: Batch, sampling: SamplingParams, hooks: Hooks | None = None, *, seeds: Seq[int] | None = None
    ) -> Batch:
        """PROMPTS/PROMPT_MASK (left-padded) -> the batch x n with RESPONSES, RESPONSE_MASK,
        ROLLOUT_LOG_PROBS, RESPONSE_TEXT. `seeds` gives each output sequence its seed; by default
        they are drawn from torch's global generator (so torch.manual_seed reproduces a call).

        `hooks` (`rollout.base.Hooks`): `on_finish` is called from the decode loop as sequences end
        (it must only hand them on: the loop waits for it); `agent` runs multi-turn trajectories
        (turns.py: RESPONSES then hold every token after the prompt, RESPONSE_MASK only the
        model's, RESPONSE_ATTENTION_MASK all of them, and `max_new_tokens` bounds the total);
        `weight_swap` loads new weights between two decode launches, keeping the tokens and KV
        blocks so far (ROLLOUT_TOKEN_VERSION (B, T) says which weights sampled each token)."""
        run = Generation(self, prompts, sampling, hooks or NO_HOOKS, seeds)
        while run.step():
            pass
        out, self.last_metrics = run.result()
        return out

"""The rollout engine interface every generation backend implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

import torch

from hybridrl.data.batch import Batch
from hybridrl.rollout.lengths import ForcedLengths


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    do_sample: bool = True
    max_new_tokens: int = 512
    # benchmarks: each response generated to a length drawn per row, EOS ignored (rollout/lengths.py,
    # rollout.forced_response_lengths); None = EOS or max_new_tokens ends it
    forced_lengths: ForcedLengths | None = None

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0


def vocab_limit(tokenizer) -> int | None:
    """The tokenizer's length: ids at or past it (the embedding's padding rows) are never sampled.
    None for a stand-in tokenizer without one (the benchmarks' random-token prompts)."""
    try:
        return len(tokenizer)
    except TypeError:
        return None


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and those of the model's config and
    generation config (instruct models often list two there, e.g. Qwen2.5's <|im_end|> and
    <|endoftext|>). All engines stop on this same set, so they agree on where a response ends."""
    ids = {tokenizer.eos_token_id}
    # `model` may also be a bare config (its own eos_token_id)
    for source in (model, getattr(model, "config", None), getattr(model, "generation_config", None)):
        eos = getattr(source, "eos_token_id", None)
        ids |= set(eos) if isinstance(eos, (list, tuple)) else {eos}
    return sorted(i for i in ids if i is not None)


class WeightSwap(Protocol):
    """New weights between two decode steps (partial rollouts; `workers/rollout.py:PartialRollout`)."""

    version: int  # the weights' version now

    def ready(self) -> bool:
        """New weights wait to be loaded."""

    def swap(self) -> int:
        """Load them into the engine; returns their version."""


@dataclass(frozen=True)
class Hooks:
    """The optional parts of one `generate` call; every engine takes them (None: plain generation).

    `on_finish(rows, tokens)`: each sequence's report as it ends, for scoring while the others
    decode (hybridrl/rewards/stream.py): its output rows (int array) and response tokens (int64
    arrays). Engines that report only at the end (hf, vllm; multi-turn, where a turn's end is not
    the trajectory's) never call it, and the caller scores the batch after.
    `weight_swap`: partial rollouts (native engine, single-turn): new weights between decode steps.
    `agent`: a `rollout.agent.loop.AgentSession` running multi-turn trajectories (native engine;
    `AgentRollout` sets it). Engines raise on a `weight_swap` or `agent` they cannot run
    (`require`), so a mode is never dropped silently; `build_rollout` refuses such pairs first."""

    on_finish: Callable[[Any, list], None] | None = None
    weight_swap: WeightSwap | None = None
    agent: Any = None

    def require(self, engine: str, *runs: str) -> None:
        """Raise if a hook other than `on_finish` and those named in `runs` is set."""
        for name in ("weight_swap", "agent"):
            if getattr(self, name) is not None and name not in runs:
                raise ValueError(f"generate(hooks.{name}=...) needs the native engine, not {engine}")


NO_HOOKS = Hooks()


class RolloutEngine(Protocol):
    """What the actor worker uses of an engine (native, hf, vllm all implement it)."""

    # Metrics of the last `generate` call (`rollout/...`, `perf/rollout_tokens_per_s`); empty when
    # the engine measures none. The actor adds them to the step's metrics.
    last_metrics: dict[str, float]

    @property
    def model(self) -> torch.nn.Module | None:
        """The module `generate` runs: the trainer's own policy module for the hf engine (the
        actor then gathers its FSDP shards around `generate`), the engine's decoder for native,
        None for vllm (weights in another process)."""

    def generate(self, prompts: Batch, sampling: SamplingParams, hooks: Hooks | None = None) -> Batch:
        """Prompts (PROMPTS, PROMPT_MASK + non-tensor fields) -> the batch repeated `n` times
        (the samples of a prompt adjacent) with RESPONSES, RESPONSE_MASK, ROLLOUT_LOG_PROBS and
        RESPONSE_TEXT added; `hooks`: the call's optional parts (`Hooks`)."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take new policy weights; a no-op for engines that read the trainer's parameters."""

    def sleep(self) -> None:
        """Free generation memory (KV cache) while the trainer runs."""

    def wake(self) -> None:
        """Re-allocate what `sleep` freed."""

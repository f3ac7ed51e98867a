"""`rollout.name=vllm`: a thin adapter over `vllm.LLM`, for machines that have vLLM installed.

UNTESTED in this repository: neither the CI machine nor the GPU machine used for development has
vLLM, so this file is exercised only up to the import check. It maps the engine interface onto
vLLM's offline API (token-id prompts, `n` samples, `logprobs=0` for the sampled token's log-prob,
sleep mode for `sleep`/`wake`, and the worker's `model.load_weights` for weight sync). Caveat:
depending on the vLLM version, the reported log-probs are of the raw or of the processed
(temperature-scaled) distribution; hybridrl's trainer uses the temperature-scaled one.
"""

from __future__ import annotations

from typing import Iterable

import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rollout.base import NO_HOOKS, Hooks, SamplingParams, eos_token_ids


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise RuntimeError(
            "actor_rollout_ref.rollout.name=vllm needs the vllm package (pip install vllm, which pins its own "
            "torch); or use rollout.name=native (hybridrl's engine) or rollout.name=hf"
        ) from e
    return vllm


class VLLMRolloutEngine:
    def __init__(self, llm, tokenizer, eos_token_ids: list[int]):
        self.llm, self.tokenizer, self.eos_token_ids = llm, tokenizer, eos_token_ids
        self.pad_token_id = tokenizer.pad_token_id
        self.last_metrics: dict[str, float] = {}
        self.model = None  # the weights live in vLLM's worker, not in a module of this process

    @classmethod
    def from_hf_model(cls, model, tokenizer, *, rollout, max_model_len: int) -> "VLLMRolloutEngine":
        vllm = _import_vllm()
        path = getattr(model, "name_or_path", "")
        llm = vllm.LLM(
            model=path,
            tokenizer=path,
            dtype="bfloat16",
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            enforce_eager=rollout.enforce_eager,
            max_num_seqs=rollout.max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=max(rollout.max_num_batched_tokens, max_model_len),
            enable_sleep_mode=True,
        )
        engine = cls(llm, tokenizer, eos_token_ids(model, tokenizer))
        engine.load_weights(model.named_parameters())  # the trainer's weights, not the directory's
        return engine

    @classmethod
    def from_config(cls, model, tokenizer, args) -> "VLLMRolloutEngine":
        """`build_rollout`'s constructor (`args`: a `rollout.factory.EngineArgs`)."""
        return cls.from_hf_model(model, tokenizer, rollout=args.rollout, max_model_len=args.max_model_len)

    @torch.no_grad()
    def generate(self, prompts: Batch, sampling: SamplingParams, hooks: Hooks | None = None) -> Batch:
        """See `RolloutEngine.generate`; `hooks.on_finish` is never called (the batch ends together)."""
        (hooks or NO_HOOKS).require("rollout.name=vllm")
        if sampling.forced_lengths is not None:
            raise ValueError("rollout.forced_response_lengths needs rollout.name=native or hf, not vllm")
        vllm = _import_vllm()
        params = vllm.SamplingParams(
            n=sampling.n,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
        )
        mask = prompts[K.PROMPT_MASK].bool()
        requests = [{"prompt_token_ids": ids[m].tolist()} for ids, m in zip(prompts[K.PROMPTS], mask)]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        seqs = [
            (list(c.token_ids), [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]) for o in outputs for c in o.outputs
        ]
        width = max(len(t) for t, _ in seqs)
        responses = torch.full((len(seqs), width), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(len(seqs), width)
        for i, (toks, lps) in enumerate(seqs):
            responses[i, : len(toks)] = torch.tensor(toks)
            log_probs[i, : len(lps)] = torch.tensor(lps)
        lengths = torch.tensor([len(t) for t, _ in seqs])
        mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
        batch = prompts.repeat_interleave(sampling.n) if sampling.n > 1 else prompts
        batch = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
        batch[K.RESPONSES], batch[K.RESPONSE_MASK], batch[K.ROLLOUT_LOG_PROBS] = responses, mask, log_probs * mask
        batch[K.RESPONSE_TEXT] = self.tokenizer.batch_decode(
            [r[: int(n)] for r, n in zip(responses, lengths)], skip_special_tokens=True
        )
        return batch

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        weights = [(name, t.detach()) for name, t in named_tensors]
        self.llm.collective_rpc(lambda worker: worker.model_runner.model.load_weights(weights))

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def wake(self) -> None:
        self.llm.wake_up()

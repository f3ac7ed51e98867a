"""Generation with Hugging Face `generate`: the reference engine, and the CPU default.

It runs on the trainer's own module, so on one device the policy it samples from is always
the current one and `load_weights` has nothing to do.
"""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rollout.base import NO_HOOKS, Hooks, SamplingParams, eos_token_ids, vocab_limit
from hybridrl.rollout.lengths import row_limits


class HFRolloutEngine:
    def __init__(self, model, tokenizer, *, max_num_seqs: int = 256, autocast_dtype=None):
        self.model, self.tokenizer = model, tokenizer
        self.max_num_seqs = max_num_seqs
        self.autocast_dtype = autocast_dtype
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id
        self.last_metrics: dict[str, float] = {}  # generate measures nothing of its own

    @classmethod
    def from_config(cls, model, tokenizer, args) -> "HFRolloutEngine":
        """`build_rollout`'s constructor (`args`: a `rollout.factory.EngineArgs`): on `model` itself."""
        return cls(model, tokenizer, max_num_seqs=args.rollout.max_num_seqs, autocast_dtype=args.autocast_dtype)

    @torch.no_grad()
    def generate(self, prompts: Batch, sampling: SamplingParams, hooks: Hooks | None = None) -> Batch:
        """See `RolloutEngine.generate`; `hooks.on_finish` is never called (the batch ends together)."""
        (hooks or NO_HOOKS).require("rollout.name=hf")
        forced = row_limits(sampling, prompts)  # benchmarks: each row's exact length, EOS ignored
        batch = prompts.repeat_interleave(sampling.n) if sampling.n > 1 else prompts
        chunks = batch.split(self.max_num_seqs)
        starts = [i * self.max_num_seqs for i in range(len(chunks))]
        outs = [
            self._generate_chunk(c, sampling, None if forced is None else forced[s : s + len(c)]) for c, s in zip(chunks, starts)
        ]
        width = max(o[0].shape[1] for o in outs)
        responses = torch.cat([_pad_right(o[0], width, self.pad_token_id) for o in outs])  # (B, R)
        log_probs = torch.cat([_pad_right(o[1], width, 0.0) for o in outs])  # (B, R)
        if forced is None:
            mask = _mask_through_eos(responses, self.eos_token_ids)  # (B, R)
        else:  # each row's first forced[row] tokens, whatever they are
            mask = (torch.arange(width)[None, :] < torch.from_numpy(forced)[:, None]).float()  # (B, R)
            responses = responses.masked_fill(mask == 0, self.pad_token_id)
        batch = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
        batch[K.RESPONSES] = responses
        batch[K.RESPONSE_MASK] = mask
        batch[K.ROLLOUT_LOG_PROBS] = log_probs * mask
        batch[K.RESPONSE_TEXT] = self.tokenizer.batch_decode(
            [r[m.bool()] for r, m in zip(responses, mask)], skip_special_tokens=True
        )
        return batch

    def _generate_chunk(self, chunk: Batch, sampling: SamplingParams, forced=None):
        """`forced`: each row's exact length (np.ndarray), or None (EOS or max_new_tokens ends it)."""
        device = next(self.model.parameters()).device
        ids, attn = chunk[K.PROMPTS].to(device), chunk[K.PROMPT_MASK].to(device)
        longest = sampling.max_new_tokens if forced is None else int(forced.max())
        kwargs = dict(max_new_tokens=longest, do_sample=not sampling.greedy)
        if not sampling.greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=max(sampling.top_k, 0))
        temp = 1.0 if sampling.greedy else sampling.temperature
        recorder = _SampledLogProbs(temp)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.autocast(device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                sequences = self.model.generate(
                    input_ids=ids,
                    attention_mask=attn,
                    eos_token_id=self.eos_token_ids if forced is None else [],  # []: none ends a response
                    pad_token_id=self.pad_token_id,
                    logits_processor=LogitsProcessorList([recorder, _NeverPastVocab(vocab_limit(self.tokenizer))]),
                    **kwargs,
                )
        finally:
            self.model.train(was_training)
        responses = sequences[:, ids.shape[1] :]  # (b, r)
        log_probs = recorder.finish(responses)  # (b, r)
        return responses.cpu(), log_probs.cpu()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        return None

    def sleep(self) -> None:
        return None

    def wake(self) -> None:
        return None


class _SampledLogProbs(LogitsProcessor):
    """Records log softmax(logits / T) of each sampled token, one step behind.

    `generate` runs user processors before its temperature/top-k/top-p warpers, so `scores`
    here are the model's logits: the same quantity the trainer computes, which keeps the two
    comparable (`training/rollout_probs_diff_mean`). Only one step's distribution is held,
    instead of `output_logits`' (B, R, V) tensor, which does not fit at a 150k vocabulary.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.prev: torch.Tensor | None = None  # (b, V) log-probs of the step before
        self.out: list[torch.Tensor] = []  # each (b,)

    def __call__(self, input_ids, scores):
        if self.prev is not None:  # input_ids now ends with the token sampled from `prev`
            self.out.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, responses: torch.Tensor) -> torch.Tensor:
        """(b, r) log-probs of `responses`, the tokens generated while this processor ran."""
        if self.prev is None:
            return torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
        self.out.append(self.prev.gather(-1, responses[:, -1:]).squeeze(-1))
        return torch.stack(self.out, dim=1)


class _NeverPastVocab(LogitsProcessor):
    """Ids at or past the tokenizer's length (the embedding's padding rows) are never drawn. It runs
    after `_SampledLogProbs`, so the recorded log-probs keep the trainer's full-vocabulary normalizer."""

    def __init__(self, limit: int | None):
        self.limit = limit

    def __call__(self, input_ids, scores):
        if self.limit is not None and scores.shape[-1] > self.limit:
            scores = scores.clone()
            scores[:, self.limit :] = float("-inf")
        return scores


def _pad_right(x: torch.Tensor, width: int, value) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def _mask_through_eos(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 on every token up to and including the first EOS, 0 after: (B, R) float32."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids, dtype=responses.dtype))
    # Count EOS tokens strictly before each position; a token is real if none came earlier.
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (before == 0).float()

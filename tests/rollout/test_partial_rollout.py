"""Partial rollouts in the native engine: new weights swapped in between two decode steps (CPU, float32).

The tokens before the swap are those of the old weights alone; after it, each token is the new
weights' greedy choice given a KV cache whose older part the old weights computed, which a
Hugging Face forward reproduces (the old model's cache for the prefix, the new model for the
rest): the same tokens and log-probs. ROLLOUT_TOKEN_VERSION marks the switch per row. Under forced response lengths (the long-tail
workload) the unfinished rows carry their tokens and log-probs across the swap and still end at
their drawn lengths.
"""

import copy

import pytest
import torch
from test_native_engine import GREEDY, engine_for, hf_model, prompts

from hybridrl.data import keys as K
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.base import Hooks
from hybridrl.rollout.lengths import ForcedLengths
from hybridrl.rollout.native.record import token_versions


class SwapAfter:
    """`weight_swap` that loads `new` at its `nth` look (a deterministic stand-in for the channel)."""

    def __init__(self, engine, new, nth: int):
        self.engine, self.new, self.nth = engine, new, nth
        self.version, self.looks = 1, 0

    def ready(self) -> bool:
        self.looks += 1
        return self.looks == self.nth

    def swap(self) -> int:
        self.engine.load_weights(self.new.named_parameters())
        self.version = 2
        return self.version


@pytest.mark.parametrize("steps_per_sync, nth", [(1, 4), (3, 2)])  # both swap after the 4th token
def test_weights_swapped_mid_generation_continue_from_the_old_cache(steps_per_sync, nth):
    old, new = hf_model("qwen2", seed=0), hf_model("qwen2", seed=1)
    batch = prompts()
    alone = engine_for(copy.deepcopy(old)).generate(batch, GREEDY)  # the old weights throughout
    engine = engine_for(copy.deepcopy(old), decode_steps_per_sync=steps_per_sync)
    out = engine.generate(batch, GREEDY, Hooks(weight_swap=SwapAfter(engine, new, nth=nth)))
    versions, mask, responses = out[K.ROLLOUT_TOKEN_VERSION], out[K.RESPONSE_MASK].bool(), out[K.RESPONSES]
    checked = 0
    for row in range(len(batch)):
        n = int(mask[row].sum())
        v = versions[row, :n]
        switch = int((v == 1).sum())
        assert torch.equal(v, torch.tensor([1] * switch + [2] * (n - switch))), v  # one switch, old then new
        assert torch.equal(responses[row, :switch], alone[K.RESPONSES][row, :switch])  # before: the old weights' tokens
        if n - switch < 2 or switch < 2:
            continue
        _continues_from_the_old_cache(old, new, batch[K.PROMPTS][row], batch[K.PROMPT_MASK][row], out, row, switch, n)
        assert not torch.equal(responses[row, switch:n], alone[K.RESPONSES][row, switch:n])  # the swap changed them
        checked += 1
    assert checked >= 2


def _continues_from_the_old_cache(old, new, prompt, prompt_mask, out, row, switch: int, n: int) -> None:
    """Tokens switch..n-1 of output `row` are the new weights' greedy choices, with their log-probs,
    decoding from a cache the old weights filled (the prompt + the tokens fed before the swap)."""
    responses = out[K.RESPONSES]
    fed = torch.cat([prompt[prompt_mask.bool()], responses[row, : switch - 1]])[None]
    with torch.no_grad():
        cache = old(fed, use_cache=True).past_key_values
        logits = new(responses[row, switch - 1 : n - 1][None], past_key_values=cache).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    assert torch.equal(logits.argmax(-1), responses[row, switch:n])
    torch.testing.assert_close(
        out[K.ROLLOUT_LOG_PROBS][row, switch:n], logp.gather(-1, responses[row, switch:n, None])[:, 0], atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize("steps_per_sync, nth", [(1, 4), (3, 2)])
def test_forced_lengths_unfinished_rows_carry_across_the_swap(steps_per_sync, nth):
    """The long-tail workload (rollout.forced_response_lengths): rows that end before the swap are the
    old weights' alone; the unfinished ones keep their tokens and log-probs from before it (equal to a
    run without the swap), go on with the new weights from that cache, and still end at exactly
    their drawn length, EOS ignored."""
    old, new = hf_model("qwen2", seed=0), hf_model("qwen2", seed=1)
    for model in (old, new):  # most ids end a response: without the forced lengths rows stop at once
        model.config.eos_token_id = [i for i in range(model.config.vocab_size) if i % 7]
    batch = prompts()
    forced = ForcedLengths(median=5.0, sigma=0.9, min_len=1, max_len=14, seed=1)
    sampling = SamplingParams(n=2, do_sample=False, temperature=0.0, max_new_tokens=14, forced_lengths=forced)
    want = forced.draw(list(batch[K.UID]), 2).tolist()
    alone = engine_for(copy.deepcopy(old)).generate(batch, sampling)
    engine = engine_for(copy.deepcopy(old), decode_steps_per_sync=steps_per_sync)
    out = engine.generate(batch, sampling, Hooks(weight_swap=SwapAfter(engine, new, nth=nth)))
    versions = out[K.ROLLOUT_TOKEN_VERSION]
    assert out[K.RESPONSE_MASK].sum(1).long().tolist() == want  # every row its length, across the swap
    finished_before, carried = 0, 0
    for row, n in enumerate(want):
        v = versions[row, :n]
        switch = int((v == 1).sum())
        assert torch.equal(v, torch.tensor([1] * switch + [2] * (n - switch)))
        # the tokens and log-probs sampled before the swap are kept as they were (the log-probs up to
        # float rounding: the two runs batch their decode steps differently, and with several CPU
        # threads the matmuls' summation order follows the batch)
        assert torch.equal(out[K.RESPONSES][row, :switch], alone[K.RESPONSES][row, :switch])
        torch.testing.assert_close(
            out[K.ROLLOUT_LOG_PROBS][row, :switch], alone[K.ROLLOUT_LOG_PROBS][row, :switch], atol=1e-5, rtol=1e-5
        )
        if switch == n:  # ended before the swap
            finished_before += 1
            continue
        carried += 1
        assert switch >= 1
        _continues_from_the_old_cache(old, new, batch[K.PROMPTS][row // 2], batch[K.PROMPT_MASK][row // 2], out, row, switch, n)
    assert finished_before >= 2 and carried >= 3, (finished_before, carried, want)


def test_without_a_swap_every_token_has_the_starting_version():
    old = hf_model("qwen2", seed=0)
    engine = engine_for(copy.deepcopy(old))
    never = SwapAfter(engine, old, nth=10**9)
    out = engine.generate(prompts(), GREEDY, Hooks(weight_swap=never))
    assert (out[K.ROLLOUT_TOKEN_VERSION] == 1).all()
    plain = engine_for(copy.deepcopy(old)).generate(prompts(), GREEDY)
    assert torch.equal(out[K.RESPONSES], plain[K.RESPONSES])


def test_token_versions_by_hand():
    import numpy as np

    got = token_versions(4, [(5, np.array([0, 2, 3])), (6, np.array([1, 3, 3]))], (3, 5))
    assert got.tolist() == [[5, 6, 6, 6, 6], [4, 4, 5, 6, 6], [4, 4, 4, 6, 6]]

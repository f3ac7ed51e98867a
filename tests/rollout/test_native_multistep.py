"""Several decode steps per launch (`decode_steps_per_sync`): the same tokens as one step per
launch, since the sampler is keyed by (seed, position); EOS and the length limit mid-launch drop
the wasted steps' tokens; every KV block comes back."""

import pytest
import torch
from test_native_engine import hf_model, prompts

from hybridrl.data import keys as K
from hybridrl.models.tiny import build_tokenizer
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.native.engine import NativeRolloutEngine

TOK = build_tokenizer()


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(n=3, temperature=1.0, max_new_tokens=37),
        SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=20),
        SamplingParams(n=2, temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=23),
    ],
    ids=["sampled-n3", "greedy", "top-k-top-p"],
)
def test_several_steps_per_launch_give_the_same_tokens(sampling):
    model, batch = hf_model("qwen2"), prompts()
    seeds = list(range(100, 100 + len(batch) * sampling.n))
    out = {}
    for steps in (1, 3, 8):
        # 4 rows for 5-15 sequences: rows leave mid-launch and waiting prompts join
        engine = NativeRolloutEngine.from_hf_model(
            model, TOK, max_model_len=64, block_size=4, max_num_seqs=4, decode_steps_per_sync=steps
        )
        out[steps] = engine.generate(batch, sampling, seeds=seeds)
        assert engine.cache.allocator.num_free == engine.cache.allocator.usable
        assert engine.last_metrics["rollout/decode_steps"] % steps == 0
    lengths = out[1][K.RESPONSE_MASK].sum(1)
    assert 0 < lengths.min() < sampling.max_new_tokens or sampling.greedy  # some end on EOS mid-launch
    for steps in (3, 8):
        assert torch.equal(out[steps][K.RESPONSES], out[1][K.RESPONSES])
        assert torch.equal(out[steps][K.RESPONSE_MASK], out[1][K.RESPONSE_MASK])
        # the batch's padded size differs launch to launch: float rounding only
        torch.testing.assert_close(out[steps][K.ROLLOUT_LOG_PROBS], out[1][K.ROLLOUT_LOG_PROBS], atol=1e-5, rtol=0)


def test_decode_steps_must_be_a_small_positive_integer():
    with pytest.raises(ValueError, match="decode_steps_per_sync must be an integer in \\[1, 64\\]"):
        NativeRolloutEngine.from_hf_model(hf_model("qwen2"), TOK, max_model_len=64, decode_steps_per_sync=0)

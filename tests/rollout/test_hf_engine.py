import pytest
import torch

from hybridrl.data import keys as K
from hybridrl.data.dataset import PromptRecord, collate_prompts
from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.models.logprobs import log_probs_from_logits, response_logits
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.hf import HFRolloutEngine, _mask_through_eos


def prompts(tok, texts):
    recs = [PromptRecord(tok(t, add_special_tokens=False)["input_ids"], t, "arith", "0", {}) for t in texts]
    return collate_prompts(recs, tok.pad_token_id, [f"u{i}" for i in range(len(texts))])


def test_mask_through_first_eos():
    r = torch.tensor([[3, 1, 0, 0], [3, 4, 5, 6], [1, 0, 0, 0]])
    assert _mask_through_eos(r, [1]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


@pytest.mark.parametrize("top_k, top_p", [(-1, 1.0), (3, 0.9)])
def test_samples_grouped_and_log_probs_match_trainer(tiny_model_dir, top_k, top_p):
    """Log-probs are of softmax(logits / T), before top-k/top-p, like the trainer's."""
    torch.manual_seed(0)
    tok = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir, random_init=True)
    engine = HFRolloutEngine(model, tok, max_num_seqs=3)  # forces several chunks
    out = engine.generate(
        prompts(tok, ["1+2=", "13+4="]), SamplingParams(n=4, temperature=0.7, top_k=top_k, top_p=top_p, max_new_tokens=5)
    )
    assert len(out) == 8 and list(out[K.UID]) == ["u0"] * 4 + ["u1"] * 4
    assert out[K.RESPONSES].shape[1] <= 5
    # the engine's log-probs are the trainer's log-probs of the same tokens at the same temperature
    with torch.no_grad():
        logits = response_logits(model.eval(), out[K.PROMPTS], out[K.PROMPT_MASK], out[K.RESPONSES], out[K.RESPONSE_MASK], 0.7)
        lp = log_probs_from_logits(logits, out[K.RESPONSES]) * out[K.RESPONSE_MASK]
    torch.testing.assert_close(out[K.ROLLOUT_LOG_PROBS], lp, atol=1e-4, rtol=0)
    assert (out[K.ROLLOUT_LOG_PROBS] <= 0).all()


def test_greedy_is_deterministic_and_seeds_reproduce(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    torch.manual_seed(1)
    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir, random_init=True), tok)
    p = prompts(tok, ["7+8=", "2+2="])
    greedy = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=4)
    assert torch.equal(engine.generate(p, greedy)[K.RESPONSES], engine.generate(p, greedy)[K.RESPONSES])
    sampled = SamplingParams(n=3, temperature=1.0, max_new_tokens=4)
    torch.manual_seed(5)
    a = engine.generate(p, sampled)[K.RESPONSES]
    torch.manual_seed(5)
    b = engine.generate(p, sampled)[K.RESPONSES]
    assert torch.equal(a, b)

import torch

from hybridrl.models.loading import load_causal_lm
from hybridrl.models.logprobs import entropy_from_logits, log_probs_from_logits, response_logits


def test_log_probs_and_entropy_match_float64_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, 11, generator=g) * 3
    labels = torch.randint(0, 11, (5, 7), generator=g)
    ref = torch.log_softmax(logits.double(), -1)
    want_lp = ref.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    want_h = -(ref.exp() * ref).sum(-1)
    torch.testing.assert_close(log_probs_from_logits(logits, labels, chunk=2).double(), want_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy_from_logits(logits, chunk=3).double(), want_h, atol=1e-5, rtol=0)


def test_response_logits_align_with_unpadded_forward(tiny_model_dir):
    """Left-padded prompts + right-padded responses give the same log-probs as each sequence alone."""
    torch.manual_seed(0)
    model = load_causal_lm(tiny_model_dir, random_init=True).eval()
    seqs = [([5, 6, 7], [8, 9]), ([5], [10, 11, 12])]
    P, R = 3, 3
    prompts = torch.zeros(2, P, dtype=torch.long)
    pmask = torch.zeros(2, P, dtype=torch.long)
    resp = torch.zeros(2, R, dtype=torch.long)
    rmask = torch.zeros(2, R)
    for i, (p, r) in enumerate(seqs):
        prompts[i, P - len(p) :], pmask[i, P - len(p) :] = torch.tensor(p), 1
        resp[i, : len(r)], rmask[i, : len(r)] = torch.tensor(r), 1
    with torch.no_grad():
        lp = log_probs_from_logits(response_logits(model, prompts, pmask, resp, rmask), resp)
        for i, (p, r) in enumerate(seqs):
            ids = torch.tensor([p + r])
            full = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            want = torch.stack([full[len(p) - 1 + t, r[t]] for t in range(len(r))])
            torch.testing.assert_close(lp[i, : len(r)].double(), want, atol=1e-5, rtol=0)

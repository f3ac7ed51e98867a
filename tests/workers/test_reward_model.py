"""The reward-model worker: its scores equal a direct forward of the same Hugging Face model on the
same text (same tokenizer as the policy, and a different one with its own chat template), packed,
padded and token-budget micro-batches agree, and bad reward models stop with one clear line."""

import json
import time

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedTokenizerFast

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.models.loading import ModelLoadError
from hybridrl.models.tiny import CHARS, SPECIAL, build_tokenizer, tiny_qwen2_config
from hybridrl.workers.reward_model import RewardModelError, RewardModelWorker

PROMPTS = ["12+30=", "7+5=", "40+9=", "3+3="]
RESPONSES = ["42", "13", "49<eos>", "6"]  # special tokens are dropped from the decoded text


def _rm_dir(path, tok, seed):
    """A tiny Qwen2 sequence classifier (num_labels=1) with random weights, saved with `tok`."""
    torch.manual_seed(seed)
    cfg = tiny_qwen2_config(
        len(tok), architectures=["Qwen2ForSequenceClassification"], num_labels=1, pad_token_id=tok.pad_token_id
    )
    (path / "config.json").parent.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    torch.nn.init.normal_(model.score.weight, std=0.5)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model.eval()


def _other_tokenizer():
    """A second tiny tokenizer: the same characters under other ids, and a chat template with roles."""
    vocab = {t: i for i, t in enumerate(SPECIAL + ["|"] + list(reversed(CHARS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = "{% for m in messages %}{{ m['role'][0] }}|{{ m['content'] }}#{% endfor %}"
    return fast


def _cfg(policy_dir, rm_dir, **rm):
    return config_from_dict(
        {
            "data": {"train_files": "unused.jsonl", "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {"model": {"path": str(policy_dir), "random_init": True}, "actor": {"ppo_mini_batch_size": 4}},
            "algorithm": {"adv_estimator": "grpo"},
            "reward_model": {"enable": True, "model": {"path": str(rm_dir)}, **rm},
            "trainer": {"device": "cpu"},
        }
    )


def _batch(tok):
    """What the rollout hands over: left-padded prompt ids, right-padded response ids, the texts and chats."""
    p_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    r_ids = [tok(r, add_special_tokens=False)["input_ids"] for r in RESPONSES]
    P, R = max(map(len, p_ids)), max(map(len, r_ids))
    prompts, pmask = torch.zeros(4, P, dtype=torch.long), torch.zeros(4, P, dtype=torch.long)
    resp, rmask = torch.zeros(4, R, dtype=torch.long), torch.zeros(4, R)
    for i, (p, r) in enumerate(zip(p_ids, r_ids)):
        prompts[i, P - len(p) :], pmask[i, P - len(p) :] = torch.tensor(p), 1
        resp[i, : len(r)], rmask[i, : len(r)] = torch.tensor(r), 1
    return Batch(
        {K.PROMPTS: prompts, K.PROMPT_MASK: pmask, K.RESPONSES: resp, K.RESPONSE_MASK: rmask},
        {
            K.RAW_PROMPT: PROMPTS,
            K.RAW_CHAT: [[{"role": "user", "content": p}] for p in PROMPTS],
            K.RESPONSE_TEXT: [r.replace("<eos>", "") for r in RESPONSES],
        },
    )


def _direct(model, ids) -> float:
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def _worker(cfg):
    w = RewardModelWorker(cfg, plan_batches(cfg), torch.device("cpu"))
    w.init_model()
    return w


def test_same_tokenizer_scores_the_policy_ids_as_a_direct_forward(tmp_path, tiny_model_dir):
    tok = build_tokenizer()
    model = _rm_dir(tmp_path / "rm", tok, seed=0)
    w = _worker(_cfg(tiny_model_dir, tmp_path / "rm"))
    assert not w.rerender and w.engine.packing  # same vocabulary and template: the policy's ids, packed
    batch = _batch(tok)
    packed = w.compute_rm_score(batch)[K.RM_SCORES]
    want = [_direct(model, tok(p + r, add_special_tokens=False)["input_ids"]) for p, r in zip(PROMPTS, RESPONSES)]
    torch.testing.assert_close(packed, torch.tensor(want), rtol=1e-4, atol=1e-5)
    assert packed.std() > 0  # distinct texts, distinct scores: the test can fail
    w.cfg.reward_model.use_dynamic_bsz, w.cfg.reward_model.forward_max_token_len_per_gpu = True, 12  # reordered micro-batches
    torch.testing.assert_close(w.compute_rm_score(batch)[K.RM_SCORES], packed, rtol=1e-5, atol=1e-6)
    w.engine.packing, w.cfg.reward_model.use_dynamic_bsz, w.cfg.reward_model.micro_batch_size_per_gpu = None, False, 3
    torch.testing.assert_close(w.compute_rm_score(batch)[K.RM_SCORES], packed, rtol=1e-5, atol=1e-6)


def test_other_tokenizer_rerenders_with_its_chat_template(tmp_path, tiny_model_dir):
    other = _other_tokenizer()
    model = _rm_dir(tmp_path / "rm", other, seed=1)
    w = _worker(_cfg(tiny_model_dir, tmp_path / "rm"))
    assert w.rerender
    scores = w.compute_rm_score(_batch(build_tokenizer()))[K.RM_SCORES]
    # The RM reads "u|12+30=#a|42#" in its own ids.
    want = [
        _direct(model, other(f"u|{p}#a|{r.replace('<eos>', '')}#", add_special_tokens=False)["input_ids"])
        for p, r in zip(PROMPTS, RESPONSES)
    ]
    torch.testing.assert_close(scores, torch.tensor(want), rtol=1e-4, atol=1e-5)


def test_in_memory_module_and_bad_reward_models(tmp_path, tiny_model_dir):
    class LengthScore(torch.nn.Module):  # forward(input_ids, attention_mask) -> (b,)
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor(0.5))

        def forward(self, input_ids, attention_mask):
            return self.w * attention_mask.sum(-1)

    cfg = _cfg(tiny_model_dir, tmp_path / "none")
    w = RewardModelWorker(cfg, plan_batches(cfg), torch.device("cpu"))
    w.init_model(LengthScore())
    lengths = [len(p) + len(r.replace("<eos>", "")) + r.count("<eos>") for p, r in zip(PROMPTS, RESPONSES)]
    torch.testing.assert_close(
        w.compute_rm_score(_batch(build_tokenizer()))[K.RM_SCORES], 0.5 * torch.tensor(lengths, dtype=torch.float32)
    )

    w.engine.model.w.data.fill_(float("nan"))
    with pytest.raises(RewardModelError, match="non-finite score for 4 of 4"):
        w.compute_rm_score(_batch(build_tokenizer()))

    with pytest.raises(ModelLoadError, match="reward_model.model.path"):
        _worker(cfg)  # no such directory

    other = _other_tokenizer()
    other.chat_template = None
    _rm_dir(tmp_path / "rm", other, seed=2)
    w = _worker(_cfg(tiny_model_dir, tmp_path / "rm"))
    with pytest.raises(RewardModelError, match="no chat template"):
        w.compute_rm_score(_batch(build_tokenizer()))


def test_a_reward_model_template_that_hangs_is_one_line_before_any_scoring(tmp_path, tiny_model_dir, monkeypatch):
    # The reward model's chat template renders every scored sequence when it re-renders: it is probed
    # like the policy's (data/chat_template.py), in a forked child with a time limit.
    from hybridrl.data import chat_template

    monkeypatch.setattr(chat_template, "RENDER_S", 1.0)
    monkeypatch.setattr(chat_template, "_verdicts", {})
    other = _other_tokenizer()
    other.chat_template = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    _rm_dir(tmp_path / "rm", other, seed=1)
    started = time.monotonic()
    with pytest.raises(RewardModelError) as e:
        _worker(_cfg(tiny_model_dir, tmp_path / "rm"))
    assert time.monotonic() - started < 30
    msg = str(e.value)
    assert msg.startswith("reward_model.model.path=") and "takes more than 1 s" in msg and "\n" not in msg

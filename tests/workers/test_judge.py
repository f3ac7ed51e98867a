"""The generative reward model: each score is parse_fn of the judge's greedy answer to the filled-in
template, as a direct `generate` of the same model gives it; unparsable answers score 0 and count."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.models.tiny import build_tokenizer
from hybridrl.rewards.judge import last_number
from hybridrl.workers.judge import JudgeWorker

PROMPTS, RESPONSES, TRUTHS = ["12+30=", "7+5=", "40+9=", "3+3="], ["42", "13", "49", "x"], ["42", "12", "49", "6"]


def first_digit_or_none(text):  # a parse function by dotted path, returning None when nothing parses
    return next((float(c) for c in text if c.isdigit()), None)


@pytest.fixture
def judge_dir(tmp_path, tiny_model_dir):
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.initializer_range = 0.3  # a random judge that says varied things: some verdicts have digits, some none
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(tmp_path / "judge")
    build_tokenizer().save_pretrained(tmp_path / "judge")
    return tmp_path / "judge", model.eval()


def _worker(tiny_model_dir, path, parse_fn):
    cfg = config_from_dict(
        {
            "data": {"train_files": "unused.jsonl", "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {"model": {"path": tiny_model_dir, "random_init": True}, "actor": {"ppo_mini_batch_size": 4}},
            "algorithm": {"adv_estimator": "grpo"},
            "reward_model": {
                "enable": True,
                "model": {"path": str(path)},
                "generative": {
                    "enable": True,
                    "prompt_template": "{prompt}{response}#{ground_truth}=",
                    "parse_fn": parse_fn,
                    "max_new_tokens": 6,
                },
            },
            "trainer": {"device": "cpu"},
        }
    )
    w = JudgeWorker(cfg, plan_batches(cfg), torch.device("cpu"))
    w.init_model()
    return w


def _direct(model, tok, text):
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=6,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


@pytest.mark.parametrize("parse_fn", ["hybridrl.rewards.judge:last_number", f"{__name__}.first_digit_or_none"])
def test_judge_scores_are_the_parsed_greedy_verdicts(judge_dir, tiny_model_dir, parse_fn):
    path, model = judge_dir
    w = _worker(tiny_model_dir, path, parse_fn)
    batch = Batch({}, {K.RAW_PROMPT: PROMPTS, K.RESPONSE_TEXT: RESPONSES, K.GROUND_TRUTH: TRUTHS})
    out = w.compute_rm_score(batch)
    tok = build_tokenizer()
    verdicts = [_direct(model, tok, f"{p}{r}#{t}=") for p, r, t in zip(PROMPTS, RESPONSES, TRUTHS)]
    assert list(out[K.JUDGE_VERDICT]) == verdicts
    parse = last_number if parse_fn.endswith("last_number") else first_digit_or_none
    want = [parse(v) for v in verdicts]
    assert None in want and any(s is not None and s != 0 for s in want)  # both paths are taken
    assert out[K.RM_SCORES].tolist() == [0.0 if s is None else s for s in want]
    assert out[K.JUDGE_PARSE_FAILED].tolist() == [float(s is None) for s in want]


def test_a_missing_parse_function_is_one_line(judge_dir, tiny_model_dir):
    with pytest.raises(ValueError, match=r"reward_model.generative.parse_fn='no_such.module:f' cannot be loaded"):
        _worker(tiny_model_dir, judge_dir[0], "no_such.module:f")

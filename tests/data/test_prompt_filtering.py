"""data.truncation=middle and data.filter_overlong_prompts (character-level tiny tokenizer: one token per character)."""

import json
import logging

import pytest

from hybridrl.data.dataset import DataError, load_prompt_records, truncate
from hybridrl.models.loading import load_tokenizer


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def write(tmp_path, prompts):
    p = tmp_path / "d.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": c}], "data_source": "arith", "reward_model": {"ground_truth": "0"}}
        for c in prompts
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def test_middle_truncation_keeps_the_first_and_last_halves(tmp_path, tok):
    recs = load_prompt_records(write(tmp_path, ["123456789="]), tok, max_prompt_length=5, truncation="middle")
    assert tok.decode(recs[0].prompt_ids) == "1289="  # first 5 // 2 = 2 tokens, last 3
    assert truncate(list(range(10)), 4, "middle") == [0, 1, 8, 9]
    assert truncate(list(range(10)), 1, "middle") == [9]


def test_filter_overlong_prompts_drops_them_with_a_count(tmp_path, tok, caplog):
    path = write(tmp_path, ["1+2=", "123456789=", "3+4=", "11111+22222="])  # 4, 10, 4, 12 tokens
    with caplog.at_level(logging.WARNING, logger="hybridrl.data"):
        recs = load_prompt_records(path, tok, max_prompt_length=5, filter_overlong=True)
    assert [tok.decode(r.prompt_ids) for r in recs] == ["1+2=", "3+4="]
    assert "dropped 2 prompt(s) longer than data.max_prompt_length=5" in caplog.text and "2 remain" in caplog.text
    # the filter wins over truncation, as in verl
    assert len(load_prompt_records(path, tok, max_prompt_length=5, truncation="left", filter_overlong=True)) == 2


def test_filtering_every_prompt_says_what_to_change(tmp_path, tok):
    with pytest.raises(DataError, match="dropped them all; raise data.max_prompt_length"):
        load_prompt_records(write(tmp_path, ["123456789="]), tok, max_prompt_length=5, filter_overlong=True)

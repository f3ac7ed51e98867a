import json

import pytest

from hybridrl.data import keys as K
from hybridrl.data.dataset import DataError, PromptLoader, load_prompt_records
from hybridrl.models.loading import load_tokenizer


def write(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def row(content="1+2=", gt="3", source="arith"):
    return {"prompt": [{"role": "user", "content": content}], "data_source": source, "reward_model": {"ground_truth": gt}}


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def test_records_tokenize_through_chat_template(tmp_path, tok):
    recs = load_prompt_records(write(tmp_path, [row("12+7=")]), tok, max_prompt_length=16)
    assert tok.decode(recs[0].prompt_ids) == "12+7="
    assert recs[0].ground_truth == "3" and recs[0].data_source == "arith"


@pytest.mark.parametrize(
    "bad, msg",
    [
        ({"data_source": "arith", "reward_model": {"ground_truth": "1"}}, "missing the prompt field 'prompt'"),
        ({**row(), "prompt": 5}, "must be a string or a non-empty list"),
        ({**row(), "prompt": [{"content": "x"}]}, "'role' and 'content'"),
        ({**row(), "data_source": None}, "missing 'data_source'"),
        ({**row(), "reward_model": {}}, "missing reward_model.ground_truth"),
        (row("1+\ud800="), "prompt message 0: the text holds '\\ud800' at character 2"),
        ({**row(), "prompt": "x\udfff"}, "a lone UTF-16 surrogate"),
    ],
)
def test_malformed_row_names_file_and_index(tmp_path, tok, bad, msg):
    path = write(tmp_path, [row(), row(), bad])
    with pytest.raises(DataError) as e:
        load_prompt_records(path, tok, max_prompt_length=16)
    assert f"{path}, row 2" in str(e.value) and msg in str(e.value)


def test_truncation_modes(tmp_path, tok):
    path = write(tmp_path, [row("123456789=")])
    with pytest.raises(DataError, match="10 tokens > data.max_prompt_length=4"):
        load_prompt_records(path, tok, max_prompt_length=4)
    left = load_prompt_records(path, tok, max_prompt_length=4, truncation="left")
    right = load_prompt_records(path, tok, max_prompt_length=4, truncation="right")
    assert tok.decode(left[0].prompt_ids) == "789=" and tok.decode(right[0].prompt_ids) == "1234"


def test_loader_left_pads_and_resumes_exactly(tmp_path, tok):
    rows = [row(f"{i}+{i}=", str(2 * i)) for i in range(10)]
    recs = load_prompt_records(write(tmp_path, rows), tok, max_prompt_length=16)
    a = PromptLoader(recs, 3, tok.pad_token_id, seed=5)
    first = [a.next_batch() for _ in range(4)]  # crosses an epoch (3 batches per epoch)
    b = first[0]
    assert b[K.PROMPT_MASK][:, -1].all()  # left-padded: last column always real
    assert (b[K.PROMPTS][b[K.PROMPT_MASK] == 0] == tok.pad_token_id).all()
    # a second loader restored from a state continues with the same batches
    c = PromptLoader(recs, 3, tok.pad_token_id, seed=5)
    c.load_state_dict({"epoch": 0, "position": 2})
    assert list(c.next_batch()[K.UID]) == list(first[2][K.UID])
    assert list(c.next_batch()[K.UID]) == list(first[3][K.UID])
    assert a.epoch == 1


def test_batch_larger_than_dataset_is_an_error(tmp_path, tok):
    recs = load_prompt_records(write(tmp_path, [row()] * 3), tok, max_prompt_length=16)
    with pytest.raises(DataError, match="use at most 3"):
        PromptLoader(recs, 4, 0)

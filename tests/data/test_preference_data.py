import json

import pytest
import torch

from hybridrl.data import keys as K
from hybridrl.data.dataset import DataError
from hybridrl.data.preference import RecordLoader, collate_records, load_preference_records
from hybridrl.models.loading import load_tokenizer

MSG = [{"role": "user", "content": "1+2="}]


def write(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def load(path, tok, kind, **kw):
    return load_preference_records(path, tok, kind, max_prompt_length=8, max_response_length=4, **kw)


def test_pairs_tokenize_as_text_or_messages_with_eos(tmp_path, tok):
    rows = [
        {"prompt": MSG, "chosen": "3", "rejected": "4"},
        {"prompt": MSG, "chosen": [{"role": "assistant", "content": "3"}], "rejected": "45"},
        {"prompt": "7+1=", "chosen": "8", "rejected": "9"},
    ]
    recs = load(write(tmp_path, rows), tok, "dpo")
    assert tok.decode(recs[0].prompt_ids) == "1+2=" and recs[0].completions[K.CHOSEN] == tok("3")["input_ids"] + [1]
    assert recs[1].completions[K.CHOSEN] == recs[0].completions[K.CHOSEN]  # message rendered by the template
    batch = collate_records(recs, tok.pad_token_id)
    assert batch[K.CHOSEN].shape == batch[K.REJECTED].shape == (3, 3)  # one width R for both
    assert batch[K.REJECTED_MASK][1].tolist() == [1, 1, 1] and batch[K.CHOSEN_MASK][1].tolist() == [1, 1, 0]
    assert batch[K.PROMPT_MASK][2].tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(
    "kind, bad, msg",
    [
        ("dpo", {"prompt": MSG, "chosen": "3"}, "missing 'rejected' (pairwise rows need 'prompt', 'chosen' and 'rejected')"),
        ("dpo", {"chosen": "3", "rejected": "4"}, "missing 'prompt'"),
        ("dpo", {"prompt": MSG, "chosen": "", "rejected": "4"}, "'chosen' is an empty string"),
        ("dpo", {"prompt": "1+2=", "chosen": [{"role": "assistant", "content": "3"}], "rejected": "4"}, "prompt is plain text"),
        ("dpo", {"prompt": MSG, "chosen": 3, "rejected": "4"}, "'chosen' must be a string or a non-empty list"),
        ("dpo", {"prompt": MSG, "chosen": "12345", "rejected": "4"}, "'chosen' has 6 tokens > data.max_response_length=4"),
        ("kto", {"prompt": MSG, "completion": "3"}, "missing 'label' (KTO rows need"),
        ("kto", {"prompt": MSG, "completion": "3", "label": "yes"}, "'label' must be true (desirable) or false"),
        ("sft", {"messages": MSG}, "'messages' must end with an assistant message"),
        ("sft", {"prompt": MSG}, "missing 'response' (SFT rows need 'messages', or 'prompt' and 'response')"),
        ("sft", {"messages": [{"content": "x"}]}, "'role' and 'content'"),
        ("dpo", {"prompt": MSG, "chosen": "3\ud800", "rejected": "4"}, "'chosen': the text holds '\\ud800'"),
        ("dpo", {"prompt": [{"role": "user", "content": "\ud800"}], "chosen": "3", "rejected": "4"}, "lone UTF-16 surrogate"),
    ],
)
def test_malformed_row_names_file_index_and_what_is_wrong(tmp_path, tok, kind, bad, msg):
    good = {
        "dpo": {"prompt": MSG, "chosen": "3", "rejected": "4"},
        "kto": {"prompt": MSG, "completion": "3", "label": True},
        "sft": {"messages": [*MSG, {"role": "assistant", "content": "3"}]},
    }[kind]
    path = write(tmp_path, [good, good, bad])
    with pytest.raises(DataError) as e:
        load(path, tok, kind)
    assert f"{path}, row 2" in str(e.value) and msg in str(e.value), str(e.value)


def test_kto_labels_and_mismatched_pairs_from_parquet(tmp_path, tok):
    from hybridrl.data.converters import write_rows

    rows = [{"prompt": f"{i}+0=", "completion": str(i), "label": i % 2 == 0} for i in range(6)]
    path = str(tmp_path / "k.parquet")
    write_rows(rows, path)
    recs = load(path, tok, "kto", seed=3)
    assert [r.label for r in recs] == [True, False] * 3
    partners = [r.completions[K.KL_RESPONSES] for r in recs]
    assert all(p != r.completions[K.RESPONSES] for p, r in zip(partners, recs))  # another row's completion
    assert sorted(map(tuple, partners)) == sorted(tuple(r.completions[K.RESPONSES]) for r in recs)  # a permutation
    batch = RecordLoader(recs, 4, tok.pad_token_id, seed=0).next_batch()
    assert batch[K.LABEL].dtype == torch.bool and K.KL_RESPONSE_MASK in batch


def test_sft_rows_as_messages_or_prompt_response(tmp_path, tok):
    rows = [{"messages": [*MSG, {"role": "assistant", "content": "3"}]}, {"prompt": MSG, "response": "3"}]
    a, b = load(write(tmp_path, rows), tok, "sft")
    assert a.completions == b.completions and a.prompt_ids == b.prompt_ids


def test_loader_rejects_a_batch_larger_than_the_set(tmp_path, tok):
    recs = load(write(tmp_path, [{"prompt": MSG, "chosen": "3", "rejected": "4"}]), tok, "dpo")
    with pytest.raises(DataError, match=r"data.train_batch_size=2 is larger than the training set \(1 rows\)"):
        RecordLoader(recs, 2, tok.pad_token_id)

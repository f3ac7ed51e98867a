import json

import pytest

from hybridrl.data.converters import (
    GSM8K_INSTRUCTION,
    convert_gsm8k,
    make_arith,
    read_rows,
    write_rows,
)

GSM8K_LINES = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,200 twice. Total?", "answer": "2*1200=2400\n#### 2,400"},
    {"question": "Lost 5 from 2?", "answer": "2-5=-3\n#### -3"},
]


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_convert_gsm8k_rows(tmp_path, suffix):
    src = _write_jsonl(tmp_path / "train.jsonl", GSM8K_LINES)
    out = tmp_path / "out" / f"gsm8k{suffix}"
    assert convert_gsm8k(src, out) == 3
    rows = read_rows(out)
    assert rows[0] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": GSM8K_LINES[0]["question"] + GSM8K_INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "7"},
        "extra_info": {
            "split": "train",
            "index": 0,
            "answer": GSM8K_LINES[0]["answer"],
            "question": GSM8K_LINES[0]["question"],
        },
    }
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "2400", "-3"]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2]


def test_instruction_text():
    expected = ' Let\'s think step by step and output the final answer after "####".'
    assert GSM8K_INSTRUCTION == expected


@pytest.mark.parametrize(
    "name, split, expected",
    [
        ("test.jsonl", None, "test"),
        ("gsm8k_test.jsonl", None, "test"),
        ("train.jsonl", None, "train"),
        ("raw.jsonl", None, "train"),
        ("test.jsonl", "dev", "dev"),
    ],
)
def test_split_guess(tmp_path, name, split, expected):
    src = _write_jsonl(tmp_path / name, GSM8K_LINES[:1])
    out = tmp_path / "o.jsonl"
    convert_gsm8k(src, out, split=split)
    assert read_rows(out)[0]["extra_info"]["split"] == expected


def test_blank_lines_are_skipped(tmp_path):
    src = tmp_path / "train.jsonl"
    src.write_text(json.dumps(GSM8K_LINES[0]) + "\n\n" + json.dumps(GSM8K_LINES[1]) + "\n")
    out = tmp_path / "o.jsonl"
    assert convert_gsm8k(src, out) == 2
    assert [r["extra_info"]["index"] for r in read_rows(out)] == [0, 1]


@pytest.mark.parametrize(
    "bad_line, fragment",
    [
        ('{"question": "q"}', "'answer'"),
        ('{"answer": "#### 1"}', "'question'"),
        ('{"question": "q", "answer": "no final number"}', "####"),
        ('{"question": "q", "answer": 5}', "'answer'"),
        ("[1, 2]", "JSON object"),
        ("{not json", "invalid JSON"),
    ],
)
def test_malformed_line_reports_file_and_line(tmp_path, bad_line, fragment):
    src = tmp_path / "train.jsonl"
    src.write_text(json.dumps(GSM8K_LINES[0]) + "\n" + bad_line + "\n")
    with pytest.raises(ValueError) as err:
        convert_gsm8k(src, tmp_path / "o.jsonl")
    assert f"{src}:2:" in str(err.value)
    assert fragment in str(err.value)


def test_bad_output_extension_fails_first(tmp_path):
    src = _write_jsonl(tmp_path / "train.jsonl", GSM8K_LINES)
    with pytest.raises(ValueError, match=".csv"):
        convert_gsm8k(src, tmp_path / "o.csv")
    assert not (tmp_path / "o.csv").exists()


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_write_read_roundtrip(tmp_path, suffix):
    rows = [{"a": 1, "b": {"c": "x", "d": [1, 2]}}, {"a": 2, "b": {"c": "é", "d": []}}]
    path = tmp_path / "deep" / "dir" / f"rows{suffix}"
    assert write_rows(rows, path) == 2
    assert read_rows(path) == rows


def test_read_rows_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        read_rows(tmp_path / "missing.jsonl")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        read_rows(tmp_path / "rows.csv")
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_rows(tmp_path / "bad.jsonl")


def _problems(rows):
    return {r["prompt"][0]["content"] for r in rows}


def test_make_arith_files(tmp_path):
    paths = make_arith(tmp_path / "arith", n_train=30, n_test=10, n_sft=20, seed=1)
    assert set(paths) == {"sft", "train", "test"}
    sft, train, test = (read_rows(paths[k]) for k in ("sft", "train", "test"))
    assert (len(sft), len(train), len(test)) == (20, 30, 10)

    row = sft[0]
    a, b = map(int, row["prompt"][0]["content"].rstrip("=").split("+"))
    assert 0 <= a <= 49 and 0 <= b <= 49
    assert row["prompt"] == [{"role": "user", "content": f"{a}+{b}="}]
    assert row["data_source"] == "arith"
    assert row["reward_model"]["ground_truth"] == str(a + b)
    assert row["response"] == str(a + b)
    assert row["extra_info"] == {"split": "sft", "index": 0}
    assert "response" not in train[0] and "response" not in test[0]
    assert [r["extra_info"]["index"] for r in test] == list(range(10))
    assert {r["extra_info"]["split"] for r in train} == {"train"}

    sets = [_problems(sft), _problems(train), _problems(test)]
    assert [len(s) for s in sets] == [20, 30, 10]  # no duplicates within a file
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])


def test_make_arith_deterministic(tmp_path):
    first = make_arith(tmp_path / "a", n_train=15, n_test=5, n_sft=5, seed=3)
    again = make_arith(tmp_path / "b", n_train=15, n_test=5, n_sft=5, seed=3)
    other = make_arith(tmp_path / "c", n_train=15, n_test=5, n_sft=5, seed=4)
    for split in ("sft", "train", "test"):
        assert read_rows(first[split]) == read_rows(again[split])
    assert read_rows(first["train"]) != read_rows(other["train"])


def test_make_arith_subtraction_and_bounds(tmp_path):
    paths = make_arith(tmp_path, n_train=40, n_test=0, n_sft=0, max_operand=5, ops="+-")
    rows = read_rows(paths["train"])
    ops_seen = set()
    for row in rows:
        prompt = row["prompt"][0]["content"]
        op = "+" if "+" in prompt else "-"
        ops_seen.add(op)
        a, b = map(int, prompt.rstrip("=").split(op))
        assert 0 <= a <= 5 and 0 <= b <= 5
        assert row["reward_model"]["ground_truth"] == str(a + b if op == "+" else a - b)
    assert ops_seen == {"+", "-"}
    assert read_rows(paths["test"]) == [] and read_rows(paths["sft"]) == []


def test_make_arith_uses_the_whole_space(tmp_path):
    # 3 x 3 operand pairs, one operator: exactly 9 problems exist.
    paths = make_arith(tmp_path, n_train=4, n_test=2, n_sft=3, max_operand=2)
    all_rows = [r for p in paths.values() for r in read_rows(p)]
    assert len(_problems(all_rows)) == 9
    with pytest.raises(ValueError, match="only 9 exist"):
        make_arith(tmp_path, n_train=5, n_test=2, n_sft=3, max_operand=2)


def test_make_arith_rejects_unknown_ops(tmp_path):
    with pytest.raises(ValueError, match="ops"):
        make_arith(tmp_path, ops="*")


def test_convert_gsm8k_for_the_tool_recipe_and_an_interaction(tmp_path):
    from hybridrl.data.converters import GSM8K_TOOL_SYSTEM

    src = _write_jsonl(tmp_path / "test.jsonl", GSM8K_LINES)
    out = tmp_path / "tool.jsonl"
    assert convert_gsm8k(src, out, tools=["python"], interaction="gsm8k") == 3
    row = read_rows(out)[0]
    assert row["prompt"] == [
        {"role": "system", "content": GSM8K_TOOL_SYSTEM},
        {"role": "user", "content": GSM8K_LINES[0]["question"] + GSM8K_INSTRUCTION},
    ]
    extra = row["extra_info"]
    assert extra["tools_kwargs"] == {"python": {"create_kwargs": {"ground_truth": "7"}}} and extra["need_tools_kwargs"]
    assert extra["interaction_kwargs"] == {"name": "gsm8k", "query": GSM8K_LINES[0]["question"], "ground_truth": "7"}
    with pytest.raises(ValueError, match="--tools shell: the GSM8K recipe knows the tool"):
        convert_gsm8k(src, tmp_path / "x.jsonl", tools=["shell"])
    with pytest.raises(ValueError, match="--interaction judge"):
        convert_gsm8k(src, tmp_path / "x.jsonl", interaction="judge")

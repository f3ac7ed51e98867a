"""verl's own GSM8K SFT example command lines (tests/verl/scripts/sft/, from examples/sft/gsm8k/*.sh):
each one loads as verl runs it, with its prompts and responses nested in the `extra_info` column
(`data.prompt_dict_keys` / `response_dict_keys`), and one of them trains on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridrl.cli.verl import main
from hybridrl.compat.verl.argv import train_args
from hybridrl.config import ConfigError, load_config
from hybridrl.data.dataset import row_field
from hybridrl.data.preference import load_preference_records
from hybridrl.models.loading import load_tokenizer

SCRIPTS = sorted((Path(__file__).parent / "scripts" / "sft").glob("*.args"))


def _argv(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]


def _value(argv: list[str], key: str) -> str | None:
    found = [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0].lstrip("+") == key]
    return found[-1] if found else None


def _sft_config(argv: list[str]):
    return load_config(None, train_args("sft", argv)[2:], verl="sft")


def test_the_corpus_holds_verls_gsm8k_sft_examples():
    assert len(SCRIPTS) == 8 and all("data.prompt_dict_keys=[question]" in _argv(p) for p in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_each_gsm8k_sft_example_loads_as_verl_runs_it(script):
    """On 2 devices (`torchrun --nproc_per_node=2`, as verl's scripts say they were tested): the nested
    prompt and response keys become dotted paths into extra_info, and the per-device micro-batch is
    verl's: micro_batch_size_per_gpu, or its default 4 where a script sets only the deprecated
    data.micro_batch_size (which verl's SFT trainer no longer reads)."""
    argv = _argv(script)
    cfg = _sft_config(["trainer.n_gpus_per_node=2", *argv])
    a = cfg.actor_rollout_ref.actor
    assert (cfg.algorithm.name, cfg.data.prompt_key, cfg.data.response_key) == ("sft", "extra_info.question", "extra_info.answer")
    assert a.ppo_micro_batch_size_per_gpu == int(_value(argv, "data.micro_batch_size_per_gpu") or 4)
    assert a.ulysses_sequence_parallel_size == int(_value(argv, "ulysses_sequence_parallel_size") or 1)
    assert a.optim.lr == float(_value(argv, "optim.lr") or 1e-5)
    assert cfg.actor_rollout_ref.model.lora_rank == int(_value(argv, "model.lora_rank") or 0)
    if _value(argv, "data.micro_batch_size"):
        assert any("sft.micro_batch_size (verl's SFT trainer reads only data.micro_batch_size_per_gpu" in n for n in cfg.notices)


def test_nested_keys_must_be_a_list_of_names():
    argv = ["actor_rollout_ref.model.path=m", "data.train_files=t.parquet", "data.prompt_key=extra_info"]
    with pytest.raises(ConfigError, match=r"data.prompt_dict_keys=\[1, a.b\]: give a list of the dict keys to descend"):
        _sft_config([*argv, "data.prompt_dict_keys=[1, a.b]"])
    cfg = _sft_config([*argv, "data.prompt_dict_keys=question", "data.response_dict_keys=[a, b]", "data.response_key=x"])
    assert (cfg.data.prompt_key, cfg.data.response_key) == ("extra_info.question", "x.a.b")


def test_a_dotted_key_reaches_into_dict_columns_and_a_column_of_that_name_wins():
    row = {"extra_info": {"question": "2+2?", "deeper": {"answer": "4"}}, "x.y": "flat", "x": {"y": "nested"}}
    assert row_field(row, "extra_info.question") == "2+2?"
    assert row_field(row, "extra_info.deeper.answer") == "4"
    assert row_field(row, "x.y") == "flat"
    assert row_field(row, "extra_info.missing") is None and row_field(row, "nothing") is None


def _gsm8k_rows(n: int) -> list[dict]:
    """Rows shaped as verl's examples/data_preprocess/gsm8k.py writes them (the question and answer in extra_info)."""
    out = []
    for i in range(n):
        a, b = i % 7, i % 5
        q = f"what is {a}+{b}"
        out.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": q + " Let's think step by step."}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": "train", "index": i, "question": q, "answer": f"{a}+{b}={a + b} #### {a + b}"},
            }
        )
    return out


def test_sft_rows_read_the_nested_question_and_answer(tiny_model_dir, tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_gsm8k_rows(3)), path)
    tok = load_tokenizer(tiny_model_dir)
    records = load_preference_records(
        str(path),
        tok,
        "sft",
        prompt_key="extra_info.question",
        response_key="extra_info.answer",
        max_prompt_length=64,
        max_response_length=64,
    )
    text = lambda ids: "".join(tok.convert_ids_to_tokens(ids))  # noqa: E731  (a token per character; spaces split)
    assert [text(r.prompt_ids) for r in records] == ["whatis0+0", "whatis1+1", "whatis2+2"]
    (response,) = records[2].completions.values()
    assert response[-1] == tok.eos_token_id and text(response[:-1]) == "2+2=4####4"


@pytest.mark.slow
def test_verls_gemma_7b_example_trains_on_nested_keys(tiny_model_with_weights, tmp_path, capsys):
    """run_gemma_7b.sh as it is, with the arguments its `$@` takes: this machine's data, model, device
    and a short run."""
    train = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_gsm8k_rows(16)), train)
    out = tmp_path / "run"
    extra = [
        f"data.train_files={train}",
        f"model.partial_pretrain={tiny_model_with_weights}",
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
        "trainer.total_training_steps=2",
        "data.train_batch_size=8",
        "data.max_length=32",
        "model.enable_gradient_checkpointing=false",
        "trainer.logger=console",
        f"trainer.default_local_dir={out}",
    ]
    argv = _argv(Path(__file__).parent / "scripts" / "sft" / "run_gemma_7b.args")
    assert main("sft", argv + extra) == 0
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2] and all(r["loss"] > 0 for r in steps)
    # two steps of 8 rows are the 16 rows once: the tokens trained on are every nested answer's, EOS included
    answers = [r["extra_info"]["answer"].replace(" ", "") for r in _gsm8k_rows(16)]
    assert sum(r["num_tokens"] for r in steps) == sum(len(a) + 1 for a in answers)
    cfg = load_config(out / "config.yaml")
    assert (cfg.data.prompt_key, cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu) == ("extra_info.question", 4)
